"""Write bench/data/timm_models.json: the installed timm's registered architectures and deprecated names (each with
what timm builds for it), with its version.

`bench` validates a model name against this list when the installed timm is that version, so a command on an empty
cache checks a name without importing timm (and torch): rerun this after changing timm's pin in constraints.txt
(tests/test_model_ref.py fails until the list matches the pinned timm).
"""

from __future__ import annotations

import json
import sys

import timm

from bench.grid.model_ref import SHIPPED_TIMM_NAMES


def main() -> int:
    names = timm.list_models()
    deprecated = dict(sorted(timm.models.get_deprecated_models().items()))
    document = {"timm": timm.__version__,
                "source": f"timm.list_models() and timm.models.get_deprecated_models() of timm {timm.__version__}",
                "names": names, "deprecated": deprecated}
    SHIPPED_TIMM_NAMES.write_text(json.dumps(document, indent=0) + "\n")
    print(f"{len(names)} architectures and {len(deprecated)} deprecated names of timm {timm.__version__} -> "
          f"{SHIPPED_TIMM_NAMES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
