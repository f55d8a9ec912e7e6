"""KV-cache ladder benchmark (issue 6): `python bench/ladder.py [--model ...]`.

Same as `kvpd bench ladder`; see `realexec/fidelity/ladder.py` for what each rung measures.
"""

from __future__ import annotations

import argparse
import sys

from realexec.fidelity.ladder import add_arguments, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
