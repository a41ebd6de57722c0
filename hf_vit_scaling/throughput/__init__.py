"""The throughput report: timing callback (`timing`), pure summary (`summary`), schema and loader (`schema`), the
printed table (`report`)."""

from hf_vit_scaling.throughput.report import format_report
from hf_vit_scaling.throughput.schema import REPORT_FILENAME, REPORT_SCHEMA, SCHEMA_VERSION, load_throughput_report
from hf_vit_scaling.throughput.summary import estimate_sync_wait, summarize
from hf_vit_scaling.throughput.timing import ThroughputCallback, add_throughput_callback

__all__ = [
    "REPORT_FILENAME",
    "REPORT_SCHEMA",
    "SCHEMA_VERSION",
    "ThroughputCallback",
    "add_throughput_callback",
    "estimate_sync_wait",
    "format_report",
    "load_throughput_report",
    "summarize",
]
