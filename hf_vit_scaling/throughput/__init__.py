"""The throughput report: timing callback (`timing`), pure summary (`summary`), schema and loader (`schema`), the
printed table (`report`)."""

from hf_vit_scaling.utils import lazy_exports

# Imported on first use (see hf_vit_scaling/__init__.py): reading a report does not load the timing callback.
_EXPORTS = {
    "format_report": ".report",
    "REPORT_FILENAME": ".schema",
    "REPORT_SCHEMA": ".schema",
    "SCHEMA_VERSION": ".schema",
    "load_throughput_report": ".schema",
    "estimate_sync_wait": ".summary",
    "summarize": ".summary",
    "ThroughputCallback": ".timing",
    "add_throughput_callback": ".timing",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
