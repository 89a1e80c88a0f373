"""Which model on which instance: the cost of a decision handled automatically, the Pareto front of
cost against automatically handled share, and the recommendation rule."""

from __future__ import annotations

from llamadecide.prices import cost_table

AUTO_SHARE_MARGIN = 0.05  # default rule: within 5 points of the best share any model reaches


def instance_rows(
    prices: dict,
    *,
    throughput_rps: float,
    cpu_vcpu: int,
    auto_share: float | None,
    model_bytes: int | None,
    gpu_rps: float | None = None,
    gpu_basis: str = "measured on GPU",
    review_cost: float | None = None,
) -> list[dict]:
    """Per instance: dollars per 1,000 decisions (the bench's cost table), per 1,000 decisions
    handled automatically (every request is paid for, only `auto_share` of them act alone), and with
    `review_cost` (USD a person's review of one decision costs) the total per 1,000 decisions: the
    compute and the people who take the escalated share (all of it without a certified threshold)."""
    rows = []
    for row in cost_table(
        prices,
        cpu_rps=throughput_rps,
        cpu_vcpu=cpu_vcpu,
        gpu_rps=gpu_rps,
        gpu_basis=gpu_basis,
        model_bytes=model_bytes,
    ):
        usd = row["usd_per_1000"]
        rows.append(
            {
                "name": row["instance_type"],
                "vcpu": row["vcpu"],
                "gpu": row.get("gpu"),
                "usd_per_hour": row["usd_per_hour"],
                "requests_per_second": row["requests_per_second"],
                "usd_per_1000": usd,
                "usd_per_1000_auto": usd / auto_share if usd is not None and auto_share else None,
                "usd_per_1000_total": total_cost(usd, auto_share, review_cost),
                "basis": row["basis"],
            }
        )
    return rows


def total_cost(usd_per_1000: float | None, auto_share: float | None, review_cost: float | None) -> float | None:
    """Compute plus reviews per 1,000 decisions: every escalated decision costs a review."""
    if usd_per_1000 is None or review_cost is None:
        return None
    return usd_per_1000 + (1.0 - (auto_share or 0.0)) * 1000 * review_cost


def break_even(first: tuple[dict, dict], second: tuple[dict, dict]) -> dict | None:
    """The review cost at which two (model, instance) pairs cost the same in total: above it the one
    handling more automatically is cheaper, below it the one cheaper to compute. None when their
    shares are equal (they never cross)."""
    (m1, i1), (m2, i2) = first, second
    s1, s2 = m1.get("auto_share") or 0.0, m2.get("auto_share") or 0.0
    if abs(s1 - s2) < 1e-12:
        return None
    cost = (i2["usd_per_1000"] - i1["usd_per_1000"]) / (1000 * (s2 - s1))
    more, less = ((m1, i1), (m2, i2)) if s1 > s2 else ((m2, i2), (m1, i1))
    return {
        "usd_per_review": cost,
        "above": f"{more[0]['model']} on {more[1]['name']}",
        "below": f"{less[0]['model']} on {less[1]['name']}",
    }


def recommend_by_total(models: list[dict], review_cost: float) -> dict:
    """The (model, instance) with the lowest total cost per 1,000 decisions, compute and reviews (a
    model with no certified threshold escalates everything), the runner-up on another model, and the
    review cost at which the two would swap."""
    pairs = [
        (model, instance)
        for model in models
        if not model.get("error")
        for instance in model["instances"]
        if instance.get("usd_per_1000_total") is not None
    ]
    rule = f"lowest total per 1,000 decisions: compute and {review_cost:g} USD a review of each escalated one"
    if not pairs:
        return {"choice": None, "rule": rule, "why": "no model with a priced instance"}
    ranked = sorted(pairs, key=lambda pair: pair[1]["usd_per_1000_total"])
    model, instance = ranked[0]
    choice = {**_pair(model, instance), "usd_per_1000_total": instance["usd_per_1000_total"]}
    others = [pair for pair in ranked if pair[0]["model"] != model["model"]]
    result = {"choice": choice, "rule": rule, "review_cost": review_cost, "runner_up": None, "break_even": None}
    why = (
        f"{model['model']} on {instance['name']}: {instance['usd_per_1000_total']:.2f} USD per 1,000 decisions "
        f"({instance['usd_per_1000']:.4f} of compute, {(1 - (model['auto_share'] or 0)):.1%} escalated)"
    )
    if others:
        second = others[0]
        result["runner_up"] = {**_pair(*second), "usd_per_1000_total": second[1]["usd_per_1000_total"]}
        result["break_even"] = break_even((model, instance), second)
        why += f"; then {second[0]['model']} on {second[1]['name']} at {second[1]['usd_per_1000_total']:.2f}"
    result["why"] = why
    return result


def priced(models: list[dict]) -> list[tuple[dict, dict]]:
    """(model, instance) pairs with a cost per 1,000 automatically handled decisions."""
    return [
        (model, instance)
        for model in models
        if not model.get("error") and model.get("threshold") is not None
        for instance in model["instances"]
        if instance["usd_per_1000_auto"] is not None
    ]


def pareto_front(models: list[dict]) -> list[tuple[str, str]]:
    """(model, instance) pairs no other pair beats on both cost per 1,000 automatically handled
    decisions and automatically handled share."""
    pairs = priced(models)
    front = []
    for model, instance in pairs:
        cost, share = instance["usd_per_1000_auto"], model["auto_share"]
        dominated = any(
            other_i["usd_per_1000_auto"] <= cost
            and other_m["auto_share"] >= share
            and (other_i["usd_per_1000_auto"] < cost or other_m["auto_share"] > share)
            for other_m, other_i in pairs
        )
        if not dominated:
            front.append((model["model"], instance["name"]))
    return front


def recommend(models: list[dict], target_precision: float, min_auto_share: float | None = None) -> dict:
    """The cheapest (model, instance) per 1,000 automatically handled decisions among models whose
    threshold reaches the target precision on at least the required share, and the runner-up with
    why it lost."""
    reaching = [m for m in models if not m.get("error") and m.get("threshold") is not None]
    if not reaching:
        return {
            "choice": None,
            "rule": f"precision {target_precision} reached by a threshold",
            "why": f"no model reaches precision {target_precision} at any threshold with the stated confidence "
            "(more labelled items, a lower target or a stronger model)",
        }
    best_share = max(m["auto_share"] for m in reaching)
    required = min_auto_share if min_auto_share is not None else max(0.0, best_share - AUTO_SHARE_MARGIN)
    rule = (
        f"cheapest per 1,000 automatically handled decisions at precision {target_precision}, "
        f"handling at least {required:.1%} automatically"
        + ("" if min_auto_share is not None else f" (the best share, {best_share:.1%}, less 5 points)")
    )
    # Cheapest first (per 1,000 automatically handled; on a tie, the larger share).
    ranked = sorted(priced(reaching), key=lambda pair: (pair[1]["usd_per_1000_auto"], -pair[0]["auto_share"]))
    candidates = [pair for pair in ranked if pair[0]["auto_share"] >= required - 1e-12]
    if not candidates:
        return {"choice": None, "rule": rule, "why": "no model with a priced instance handles that share"}
    model, instance = candidates[0]
    choice = _pair(model, instance)
    cost = instance["usd_per_1000_auto"]
    # The runner-up: the cheapest pair on another model that meets the rule, else the cheapest pair on
    # another model at all (it lost on share), else the same model's next instance.
    others = [pair for pair in candidates[1:] if pair[0]["model"] != model["model"]]
    others = others or [pair for pair in ranked if pair[0]["model"] != model["model"]] or candidates[1:]
    runner_up = None
    if others:
        second_model, second_instance = others[0]
        runner_up = _pair(second_model, second_instance)
        ratio = second_instance["usd_per_1000_auto"] / cost
        if second_model["auto_share"] < required - 1e-12:
            runner_up["why"] = (
                f"handles {second_model['auto_share']:.1%} automatically, below the required {required:.1%}, "
                f"at {ratio:.2f}x the cost per 1,000 automatically handled decisions"
            )
        else:
            runner_up["why"] = (
                f"{ratio:.2f}x the cost per 1,000 automatically handled decisions "
                f"({second_model['auto_share']:.1%} handled automatically against {model['auto_share']:.1%})"
            )
    left_out = sorted(m["model"] for m in reaching if m["auto_share"] < required - 1e-12)
    why = (
        f"{model['model']} on {instance['name']}: {instance['usd_per_1000_auto']:.4f} USD per 1,000 automatically "
        f"handled decisions, {model['auto_share']:.1%} of test items handled automatically at threshold "
        f"{model['threshold']:.2f} ({instance['basis']})"
    )
    if left_out:
        why += f"; below the required share: {', '.join(left_out)}"
    return {"choice": choice, "runner_up": runner_up, "rule": rule, "required_auto_share": required, "why": why}


def _pair(model: dict, instance: dict) -> dict:
    return {
        "model": model["model"],
        "instance": instance["name"],
        "usd_per_1000": instance["usd_per_1000"],
        "usd_per_1000_auto": instance["usd_per_1000_auto"],
        "auto_share": model["auto_share"],
        "accuracy": model["accuracy"],
        "basis": instance["basis"],
    }
