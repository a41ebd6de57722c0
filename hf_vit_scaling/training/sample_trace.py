"""`--trace_samples`: each training micro-batch's dataset indices, and a fingerprint of the pixels the model saw
(after every input hook: crop, augmentation, Mixup/CutMix), appended to output_dir/sample_trace/rank{R}.jsonl. The
resume tests compare these files step by step; a resumed run appends after the interrupted run's lines (the last
entry of a step wins)."""

import hashlib
import json
import os

TRACE_DIRNAME = "sample_trace"


class SampleTrace:
    """One rank's trace file: `expect` a training batch's indices before its forward, `write` them after it."""

    def __init__(self, output_dir: str, rank: int):
        self.path = os.path.join(output_dir, TRACE_DIRNAME, f"rank{rank}.jsonl")
        self._file = self._pending = self._pixels_seen = self._hook = None

    def expect(self, model, indices, extra: dict) -> None:
        """The batch about to be trained: its indices and `extra` fields are written once its forward has run."""
        self._pending = (indices, extra)
        self._watch_pixels(model)

    def _watch_pixels(self, model) -> None:
        """A forward pre-hook on the model, registered when training has begun, so it runs after every input hook
        (the recipe's and the throughput clock's): it fingerprints the pixels the model is given."""
        if self._hook is not None:
            return

        def fingerprint(module, args, kwargs):
            pixels = kwargs.get("pixel_values", args[0] if args else None)
            if pixels is not None and module.training:
                data = pixels.detach().float().contiguous().cpu().numpy().tobytes()
                self._pixels_seen = hashlib.sha1(data).hexdigest()[:16]

        self._hook = model.register_forward_pre_hook(fingerprint, with_kwargs=True)

    def write(self, step: int) -> None:
        """After the forward: the pending batch's line for `step` (nothing pending: nothing written)."""
        if self._pending is None:
            return
        (indices, extra), self._pending = self._pending, None
        pixels, self._pixels_seen = self._pixels_seen, None
        if self._file is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # appending: a resumed run adds its steps
        record = {"step": step, "indices": [int(i) for i in indices.tolist()], **extra}
        if pixels is not None:
            record["pixels"] = pixels
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()  # in the page cache: survives a SIGKILL of this process

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._file is not None:
            self._file.close()
            self._file = None
