"""Instance prices and what a throughput costs on each instance: the table `llamadecide bench` and
`llamadecide plan` both read (`prices.json` beside this module, or one the user passes)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from llamadecide.errors import InvalidRequestError

PRICE_COLUMNS = ("instance_type", "vcpu", "usd_per_hour")


def load_prices(path: Path | None = None) -> dict:
    """The shipped price table, or one the user passes; a table lacking what costs are computed from
    is refused with the rows and columns at fault."""
    text = Path(path).read_text() if path else resources.files("llamadecide").joinpath("prices.json").read_text()
    where = str(path) if path else "the shipped price table"
    try:
        prices = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(prices, dict) or not isinstance(prices.get("instances"), list) or not prices["instances"]:
        raise InvalidRequestError(f'{where} needs a non-empty "instances" list')
    for i, inst in enumerate(prices["instances"]):
        missing = [c for c in PRICE_COLUMNS if not isinstance(inst, dict) or inst.get(c) is None]
        if missing:
            raise InvalidRequestError(
                f"{where}: instance {i} lacks {', '.join(missing)} (needs {', '.join(PRICE_COLUMNS)})"
            )
        if not isinstance(inst["vcpu"], int | float) or not isinstance(inst["usd_per_hour"], int | float):
            raise InvalidRequestError(
                f"{where}: instance {inst['instance_type']}: vcpu and usd_per_hour must be numbers"
            )
    prices.setdefault("source", where)
    return prices


def cost_table(
    prices: dict,
    *,
    cpu_rps: float,
    cpu_vcpu: int,
    gpu_rps: float | None,
    gpu_basis: str = "measured on GPU",
    model_bytes: int | None = None,
) -> list[dict]:
    """Cost per 1,000 requests = 1000 * price_per_hour / (3600 * requests_per_second). CPU instances
    are credited with the measured throughput scaled by their vCPU count over the measuring
    machine's (an assumption, stated in the output); GPU instances only with a measured GPU row. With
    `model_bytes`, an instance whose memory cannot hold the model (its file plus 1 GiB) gets no figure."""
    rows = []
    for inst in prices["instances"]:
        needed_gib = model_bytes / 2**30 + 1.0 if model_bytes else None
        if needed_gib and inst.get("memory_gib") is not None and inst["memory_gib"] < needed_gib:
            rps, basis = None, f"does not fit: {inst['memory_gib']} GiB, the model needs about {needed_gib:.1f}"
        elif inst.get("gpu"):
            rps, basis = (gpu_rps, gpu_basis) if gpu_rps else (None, "not measured: no GPU result for this model")
        else:
            rps = cpu_rps * inst["vcpu"] / cpu_vcpu
            basis = f"measured on this machine's {cpu_vcpu} vCPU, scaled by vCPU to {inst['vcpu']}"
        cost = 1000 * inst["usd_per_hour"] / (3600 * rps) if rps else None
        rows.append({**inst, "requests_per_second": rps, "usd_per_1000": cost, "basis": basis})
    return rows
