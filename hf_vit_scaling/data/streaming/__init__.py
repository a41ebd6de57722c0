"""Streaming training data (`--streaming`): each rank reads its own shards, batch after batch, without loading the
data set; the data position is saved in every checkpoint and a resumed run trains on the same rows at every step.

Sources, each a `datasets.IterableDataset` (the library's sharding, shuffling and state):
- a folder of uint8 Parquet shards with a `manifest.json` (`--dataset_name ROOT`, local or any fsspec URL): rows are
  raw H x W x C pixels, so they go to the device path without decoding (`device_transforms`); every row gets its
  global row number as its sample id (shard offset from the manifest + row in the shard);
- `--train_files PATTERN` (Parquet or Arrow files, local or remote) and Hub datasets (`--dataset_name ID`), read
  with `load_dataset(..., streaming=True)`; images are decoded per sample (`decoding`); the sample id is a 56-bit
  hash of the encoded image (of its path when it has no bytes).

Per rank: `split_dataset_by_node` gives each rank whole shards when the shard count is a multiple of the world
size (otherwise every rank reads every shard and keeps one row in W: warned), then `shuffle(seed, buffer_size)`
puts the rank's shards in a seeded order per pass and draws rows from a buffer fed by up to 10 open shards
(`--shuffle_buffer_size 0`: one shard at a time, rows in stored order). With DataLoader workers, datasets gives
each worker its own shards of the rank.

Batches are formed in the stream (in the worker), and the loader takes them from the workers in a fixed round
robin, so the order never depends on which worker is faster. Passes follow each other without end (one pass =
every row of the rank once); `--max_steps` bounds training.

The data position (`data_position/rank{R}.json` in each checkpoint, written before the checkpoint is marked
complete): the pass, the worker whose batch comes next, and per worker the rows its stream has given, the batches
it has made, whether it is exhausted, and (`--shuffle_buffer_size 0` without workers) datasets' own `state_dict()`.
Resuming:
- `--shuffle_buffer_size 0` and `--dataloader_num_workers 0`: the stream is restored with datasets'
  `load_state_dict` (it reopens the shard and skips to the row);
- otherwise each worker replays its stream of that pass from the start (same seed, same pass: the same rows in the
  same order) and drops the rows already given, before any decoding. datasets does not save a shuffle buffer's rows
  ("examples from shuffle buffers are lost when resuming", its `state_dict` docstring), and a worker's state does
  not load back (see `StreamingTrainData.uses_datasets_state`; the version read: docs/streaming.md, "Limits").
Either way the rows of every later step are those of the uninterrupted run. The Trainer's own skipping of trained
batches is off (`ignore_data_skip`): the position comes from the checkpoint.
"""
