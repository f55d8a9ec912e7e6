"""The per-request chat-template work of vLLM's chat route: the seconds behind
`api_server.preprocess_s` (simulator/engines/chat_template.py).

Two ranges of vLLM releases re-parsed the model's Jinja chat template on every
`/v1/chat/completions` request, in the API server's event loop, before the request reached the
engine (read in the released wheels):
- 0.6.5-0.9.1, content-format detection: the transformers-compiled template's environment
  parses the template and the AST is searched (`_detect_content_format`);
- 0.11.0, the kwargs filter: a new sandboxed environment (trim_blocks, lstrip_blocks, the
  loopcontrols extension), a parse and `jinja2.meta.find_undeclared_variables`, which runs
  Jinja's code generator over the AST (`resolve_chat_template_kwargs`).
This times both paths, interleaved, with the same jinja2 and transformers calls, on the chat
templates given: `.jinja` files or a model folder's `tokenizer_config.json` (its
`chat_template`). No template ships with kvpd; a model folder a user has, or a copy of a
model's template, serves.

    python bench/diagnostics/chat_template_parse.py TEMPLATE [TEMPLATE ...] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox
from transformers.utils.chat_template_utils import _compile_jinja_template

CALLS = 20  # per timing


def read_template(path: Path) -> str:
    """A `.jinja` file's text, or the `chat_template` of a tokenizer_config.json."""
    if path.suffix == ".json":
        template = json.loads(path.read_text()).get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise SystemExit(f"{path}: no chat_template string in it")
        return template
    return path.read_text()


def detect_content_format(template: str) -> bool:
    """vLLM 0.6.5-0.9.1's per-request path: parse with the compiled template's environment,
    then search the AST (here for a loop, as `_detect_content_format` searches for one over
    the message content)."""
    ast = _compile_jinja_template(template).environment.parse(template)
    return next(ast.find_all(jinja2.nodes.For), None) is not None


def resolve_kwargs(template: str) -> set[str]:
    """vLLM 0.11.0's per-request path (`resolve_chat_template_kwargs`)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    return jinja2.meta.find_undeclared_variables(env.parse(template))


def seconds_per_call(fn, template: str) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        fn(template)
    return (time.perf_counter() - start) / CALLS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("templates", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=7, help="interleaved rounds (median kept)")
    args = ap.parse_args()
    texts = {p: read_template(p) for p in args.templates}
    paths = (("0.6.5-0.9.1", detect_content_format), ("0.11.0", resolve_kwargs))
    times: dict[tuple[Path, str], list[float]] = {(p, n): [] for p in texts for n, _ in paths}
    for _ in range(args.repeat):
        for p, text in texts.items():
            for name, fn in paths:
                times[(p, name)].append(seconds_per_call(fn, text))
    print(f"{'template':48s} {'chars':>6s}  " + "  ".join(f"{n:>11s} ms" for n, _ in paths))
    for p, text in texts.items():
        cells = "  ".join(f"{statistics.median(times[(p, n)]) * 1e3:14.2f}" for n, _ in paths)
        print(f"{p.name[:48]:48s} {len(text):6d}  {cells}")


if __name__ == "__main__":
    main()
