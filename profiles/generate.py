"""Regenerate the committed roofline profiles: every catalog GPU x model x TP that fits.

    python -m profiles.generate [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from profiles.lookup import PROFILE_DIR, profile_filename
from profiles.roofline import build_roofline_profile, load_efficiency
from simcore.catalog import GPUS, MODELS
from simcore.errors import DoesNotFitError
from simcore.memory import plan_memory
from simcore.specs import EngineConfig

MODEL_NAMES = ("llama3-8b", "llama3-70b", "llama2-7b", "llama2-70b", "mistral-7b", "opt-13b")
TPS = (1, 2, 4, 8)


def fits(gpu, model, tp: int) -> bool:
    try:
        plan_memory(model, gpu, EngineConfig(tensor_parallel_size=tp))
    except DoesNotFitError:
        return False
    return True


def generate(out: Path = PROFILE_DIR) -> list[Path]:
    eff = load_efficiency()
    written = []
    for gpu in GPUS.values():
        for name in MODEL_NAMES:
            model = MODELS[name]
            for tp in TPS:
                if not fits(gpu, model, tp):
                    continue
                path = out / profile_filename(gpu.name, model.name, tp)
                doc = build_roofline_profile(gpu, model, tp, efficiency=eff)
                path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
                written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROFILE_DIR)
    args = parser.parse_args()
    paths = generate(args.out)
    print(f"wrote {len(paths)} roofline profiles to {args.out}")


if __name__ == "__main__":
    main()
