"""Request traces: loaders, synthetic traffic and transforms. Imports nothing from simulator/ or realexec/.

Public API:

- `Trace` (columnar numpy arrays; `trace.load_report` is the loader's `LoadReport`)
- `load_trace(path, format=None, *, skip_invalid=False, columns=None, **format_options)`,
  `detect_format`, `FORMATS`
- `write_trace(trace, path)` (generic CSV or JSONL)
- `synthesize(spec, seed)` (schema in `workloads.synthetic`)
- transforms: `scale_time`, `rescale_rate`, `time_window`, `first_n`, `limit_prompt_len`,
  `jitter_arrivals`, `scale_lengths`, `merge_traces`, `mean_rate`, `coarse_step`, `retime`
- `trace_stats`, `plot_trace`
- errors: `TraceError(ValueError)` (file, line, expected), `TraceFileNotFoundError`,
  `TraceWarning`, `LoadReport`; `Ragged` (flat values + int64 offsets)
"""

from workloads.arrivals import arrival_times
from workloads.errors import LoadReport, TraceError, TraceFileNotFoundError, TraceWarning
from workloads.loaders import FORMATS, detect_format, load_trace
from workloads.plot import plot_trace
from workloads.ragged import Ragged
from workloads.stats import trace_stats
from workloads.synthetic import synthesize, validate_spec
from workloads.trace import Trace
from workloads.transforms import (
    coarse_step,
    first_n,
    jitter_arrivals,
    limit_prompt_len,
    mean_rate,
    merge_traces,
    rescale_rate,
    retime,
    scale_lengths,
    scale_time,
    time_window,
)
from workloads.writer import write_trace

__all__ = [
    "FORMATS",
    "LoadReport",
    "Ragged",
    "Trace",
    "TraceError",
    "TraceFileNotFoundError",
    "TraceWarning",
    "arrival_times",
    "coarse_step",
    "detect_format",
    "first_n",
    "jitter_arrivals",
    "limit_prompt_len",
    "load_trace",
    "mean_rate",
    "merge_traces",
    "plot_trace",
    "rescale_rate",
    "retime",
    "scale_lengths",
    "scale_time",
    "synthesize",
    "time_window",
    "trace_stats",
    "validate_spec",
    "write_trace",
]
