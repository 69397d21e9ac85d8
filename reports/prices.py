"""On-demand $/GPU-hour for pricing deployments: a small dated built-in table, overridable.

Built-in prices are the midpoints of the "specialty cloud" on-demand ranges in Mercatus, "Cloud
GPU pricing" (https://www.mercatus-ai.com/blog/cloud-gpu-pricing, May 2026): A100 80GB
$1.10-1.50, H100 SXM5 $2.50-3.50, H200 SXM5 $3.50-4.50 per GPU-hour. That table has no A100
40GB, so it has no built-in price: give one (`--price A100-40GB=1.2`) to plan with it.
Two newer GPUs come from other dated sources, in the same spirit (specialty / neocloud on-demand):
B200 $5.25, the midpoint of the $4.50-6.00 specialized-cloud on-demand range in Lyceum Technologies,
"NVIDIA B200 GPU Cloud Pricing 2026" (lyceum.technology, March 2026); MI300X $1.99, the median
posted MI300X rate in Cliff Center, "AMD inference economics" (cliffcenter.com, 2026-05-18).
Other catalog GPUs (H100 PCIe, GB200, L40S, MI325X) have none: give `--price`.
Prices move; a user's own contract rates (`--price` or a YAML file) are what to plan with.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.simcore.catalog import get_gpu
from kvsim.simcore.errors import ConfigError

PRICES_AS_OF = "2026-05"
PRICE_SOURCE = ("https://www.mercatus-ai.com/blog/cloud-gpu-pricing (specialty-cloud on-demand midpoints); "
                "B200: lyceum.technology (March 2026, specialized-cloud midpoint); MI300X: cliffcenter.com "
                "(2026-05-18, median posted rate)")
BUILTIN_USD_PER_GPU_HOUR: dict[str, float] = {
    "H100-SXM-80GB": 3.00,
    "H200-141GB": 4.00,
    "A100-80GB": 1.30,
    "B200-180GB": 5.25,
    "MI300X-192GB": 1.99,
}


MAX_USD_PER_GPU_HOUR = 1_000_000.0  # far above any rental price (2026: $1-$10 per GPU-hour)


def _price(name: str, value: object, where: str) -> tuple[str, float]:
    try:
        gpu = get_gpu(str(name)).name
    except ConfigError as exc:  # unknown GPU: the catalog's message, naming the flag or file
        raise ConfigError(f"{where}: {exc}") from None
    try:
        if isinstance(value, bool):  # YAML `true` is not a price of $1
            raise TypeError
        usd = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: price of {name} must be a number of $/GPU-hour, got {value!r}") from None
    if not (usd > 0 and usd != float("inf")):
        raise ConfigError(f"{where}: price of {name} must be > 0 $/GPU-hour, got {value!r}")
    if usd > MAX_USD_PER_GPU_HOUR:  # 1e308 printed a 309-digit $/h and an inf-like $/M tokens
        raise ConfigError(f"{where}: price of {name} must be at most {MAX_USD_PER_GPU_HOUR:,.0f} $/GPU-hour, got {value!r}")
    return gpu, usd


def load_prices(overrides: list[str] | None = None) -> dict[str, float]:
    """The built-in table, then each `--price` in order: `GPU=USD` or a YAML file mapping GPU
    names to $/GPU-hour."""
    prices = dict(BUILTIN_USD_PER_GPU_HOUR)
    flagged: set[str] = set()
    for item in overrides or []:
        name, sep, value = item.partition("=")
        if sep:
            gpu, usd = _price(name.strip(), value.strip(), "--price")
            if gpu in flagged:  # the first one was silently replaced
                raise ConfigError(f"--price: {gpu} is given twice")
            flagged.add(gpu)
            prices[gpu] = usd
            continue
        prices.update(_prices_file(Path(item)))
    return prices


def _prices_file(path: Path) -> dict[str, float]:
    import yaml

    from kvsim.simcore.userfiles import is_special, read_text

    if is_special(path):
        raise ConfigError(f"--price {path}: not a regular file")
    if not path.is_file():
        raise ConfigError(f"--price {path}: give GPU=USD (e.g. H100-SXM-80GB=3.5) or a YAML file that exists")
    from kvsim.workloads.yaml_loader import StrictLoader  # safe, and a GPU given twice is an error

    try:
        data = yaml.load(read_text(path, "price file", encoding="utf-8-sig"), Loader=StrictLoader)  # noqa: S506
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"--price {path}: not a readable YAML file ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"--price {path}: not a readable YAML file (nested too deeply)") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--price {path}: expected a mapping of GPU name to $/GPU-hour")
    return dict(_price(name, value, f"--price {path}") for name, value in data.items())
