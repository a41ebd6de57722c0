"""Streaming or map-style: the one entry point that loads the data the arguments name.

Map-style sources (`sources`) give an `ImageClassificationData`; `--streaming` gives this rank's training stream and
the evaluation rows (`streaming.load.StreamingData`). Both answer the questions the recipe asks of its data
(`splits`, `label_names`, `raw_shape`, `stored_images`, `streaming`)."""

from hf_vit_scaling.data.sources import load_map_style_data
from hf_vit_scaling.data.types import ImageClassificationData


def load_image_classification_data(
    data_args, seed: int = 42, cache_dir: str | None = None, streaming=None
) -> ImageClassificationData:
    """Load, check and split the data the arguments name. `streaming` (StreamingArguments) with --streaming: this
    rank's training stream and the evaluation rows instead (`streaming.StreamingData`)."""
    if streaming is not None and streaming.streaming:
        from hf_vit_scaling.data.streaming.load import load_streaming_data  # a map-style run never loads streaming

        return load_streaming_data(data_args, streaming, seed, cache_dir)
    return load_map_style_data(data_args, seed, cache_dir)
