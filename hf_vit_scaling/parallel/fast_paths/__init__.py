"""DeepSpeed's fast paths: exact replacements of ZeRO's per-tensor loops (README.md in this folder: what each
replaces, when, its pins, how to turn it off). `registry` pins and installs them, `zero12` and `zero3` hold the
replacements, `common` what they share, `weight_gathers` the ZeRO-1/2 gather left in flight between two steps and
the callbacks it waits for. Nothing is imported here: a run without DeepSpeed imports only `weight_gathers`."""
