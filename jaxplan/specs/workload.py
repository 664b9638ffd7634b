"""Workload: what traffic the deployment must serve, and the SLOs it must meet."""

from __future__ import annotations

import dataclasses
import enum
import math

from jaxplan.errors import PlanError, bad_value, unknown_name
from jaxplan.specs.lengths import RequestLengths, read_lengths


class Arrival(str, enum.Enum):
    POISSON = "poisson"  # open loop at `request_rate_per_s`
    BURST = "burst"  # `num_requests` all at t=0 (offline batch, RL rollouts)
    CLOSED = "closed"  # closed loop: `concurrency` requests in flight (benchmark client)


class LengthDistribution(str, enum.Enum):
    FIXED = "fixed"
    UNIFORM = "uniform"  # mean +- spread * mean
    LOGNORMAL = "lognormal"  # coefficient of variation = spread


MAX_LENGTH_SPREAD = 5.0
SPREAD_RANGE = f"a number in [0, {MAX_LENGTH_SPREAD:g}] (uniform: +- spread x mean; lognormal: coefficient of variation)"
SPREAD_FIX = f"must be {SPREAD_RANGE}"


def length_fields(values, where: str) -> dict:
    """The request-length fields of a workload or a predict / measurement row, validated (the one rule
    for all three): {isl_distribution, osl_distribution: LengthDistribution, isl_spread, osl_spread:
    float, lengths_file: str ("" = none)}.

    values: a mapping with any of those keys; a distribution may be an enum or its name (blank = fixed,
    any case), a spread a number or numeric text (blank = 0). A lengths_file gives each request's
    lengths, so it excludes a distribution or spread beside it; it is read here (cached), so that a
    bad file is named with `where`. Raises a one-line PlanError naming the field."""
    out: dict = {}
    for side in ("isl", "osl"):
        raw = values.get(f"{side}_distribution")
        name = raw.value if isinstance(raw, LengthDistribution) else str(raw if raw not in (None, "") else "fixed").strip().lower()
        try:
            out[f"{side}_distribution"] = LengthDistribution(name)
        except ValueError:
            raise bad_value(f"{side}_distribution", raw, f"use one of {', '.join(d.value for d in LengthDistribution)} (blank = fixed)", where=where) from None
        raw = values.get(f"{side}_spread")
        try:
            spread = 0.0 if raw is None or (isinstance(raw, str) and not raw.strip()) else float(raw)
        except (TypeError, ValueError):
            spread = math.nan
        if isinstance(raw, bool) or not 0.0 <= spread <= MAX_LENGTH_SPREAD:  # NaN fails too
            raise bad_value(f"{side}_spread", raw, SPREAD_FIX, where=where)
        out[f"{side}_spread"] = spread
    lengths_file = values.get("lengths_file")
    if lengths_file in (None, ""):
        lengths_file = ""
    elif not isinstance(lengths_file, str):
        raise bad_value("lengths_file", lengths_file, "must be text (a file path)", where=where)
    else:
        for side in ("isl", "osl"):
            if out[f"{side}_distribution"] != LengthDistribution.FIXED or out[f"{side}_spread"] > 0:
                raise bad_value(f"{side}_distribution", out[f"{side}_distribution"].value, "lengths_file gives each request's lengths; leave the distribution and spread blank", where=where)
        try:
            read_lengths(lengths_file)
        except PlanError as err:
            raise PlanError(f"{where}: {err}") from None
    out["lengths_file"] = lengths_file
    return out


@dataclasses.dataclass(frozen=True)
class Workload:
    """Token lengths in tokens, rates in requests/s, latencies in seconds.

    isl/osl are means; `*_spread` shapes the distribution the replay samples
    from (uniform: +-spread*mean; lognormal: coefficient of variation), or
    `lengths_file` gives every request's lengths (see specs/lengths.py; they
    are scaled to the isl/osl means, exact at the file's own means).
    SLOs of 0 or inf mean "none".
    """

    name: str
    isl_mean_tokens: float
    osl_mean_tokens: float
    arrival: Arrival = Arrival.BURST
    request_rate_per_s: float = math.inf
    concurrency: int = 0
    num_requests: int = 1000
    isl_distribution: LengthDistribution = LengthDistribution.FIXED
    isl_spread: float = 0.0
    osl_distribution: LengthDistribution = LengthDistribution.FIXED
    osl_spread: float = 0.0
    prefix_hit_rate: float = 0.0
    ttft_slo_s: float = math.inf
    tpot_slo_s: float = math.inf
    slo_percentile: float = 99.0
    target_output_tokens_per_s: float = 0.0
    description: str = ""
    lengths_file: str = ""

    def __post_init__(self) -> None:
        where = f"workload {self.name!r}"
        # A Workload built in Python may name its enums as text ("poisson"); store the enum, so every
        # comparison and table lookup sees one type, and refuse a misspelt name here.
        try:
            object.__setattr__(self, "arrival", Arrival(self.arrival))
        except ValueError:
            raise unknown_name(f"arrival in {where}", str(self.arrival), [a.value for a in Arrival]) from None
        for field in ("isl_mean_tokens", "osl_mean_tokens"):
            value = getattr(self, field)
            if not _finite(value) or not 1 <= value <= 1e7:
                raise bad_value(field, value, "must be a token count in 1..10,000,000", where=where)
        if not _finite(self.prefix_hit_rate) or not 0 <= self.prefix_hit_rate < 1:
            raise bad_value("prefix_hit_rate", self.prefix_hit_rate, "must be in [0, 1)", where=where)
        lengths = length_fields({f: getattr(self, f) for f in ("isl_distribution", "isl_spread", "osl_distribution", "osl_spread", "lengths_file")}, where)
        for field in ("isl_distribution", "osl_distribution"):
            object.__setattr__(self, field, lengths[field])
        for field in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
                raise bad_value(field, value, "must be > 0 seconds (inf for no SLO)", where=where)
        if not _finite(self.slo_percentile) or not 50 <= self.slo_percentile < 100:
            raise bad_value("slo_percentile", self.slo_percentile, "must be in [50, 100)", where=where)
        if not _finite(self.target_output_tokens_per_s) or self.target_output_tokens_per_s < 0:
            raise bad_value("target_output_tokens_per_s", self.target_output_tokens_per_s, "must be >= 0 (0 for no target)", where=where)
        rate = self.request_rate_per_s
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or math.isnan(rate) or rate <= 0:
            raise bad_value("request_rate_per_s", rate, "must be > 0 requests/s; leave it out unless arrival = \"poisson\"", where=where)
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or not 0 <= self.concurrency <= 10_000_000:
            raise bad_value("concurrency", self.concurrency, "must be an integer in 0..10,000,000 (0 unless arrival is closed)", where=where)
        if self.arrival == Arrival.POISSON and not (_finite(self.request_rate_per_s) and self.request_rate_per_s > 0):
            raise bad_value("request_rate_per_s", self.request_rate_per_s, "Poisson arrivals need a finite rate > 0 requests/s", where=where)
        if self.arrival == Arrival.CLOSED and not (isinstance(self.concurrency, int) and self.concurrency >= 1):
            raise bad_value("concurrency", self.concurrency, "closed-loop arrivals need concurrency >= 1", where=where)
        if isinstance(self.num_requests, bool) or not isinstance(self.num_requests, int) or not 1 <= self.num_requests <= 10_000_000:
            raise bad_value("num_requests", self.num_requests, "must be an integer in 1..10,000,000", where=where)

    def check_target_is_offered(self) -> None:
        """Refuse a throughput target above what Poisson arrivals bring (rate x mean output tokens): no
        deployment outputs more than it is sent. Checked where a user's inputs enter (a workload file,
        --rate / --target-throughput), not for the winner map's scenarios, where such a cell has no winner."""
        offered = self.request_rate_per_s * self.osl_mean_tokens
        if self.arrival == Arrival.POISSON and self.target_output_tokens_per_s > offered * (1 + 1e-6):
            raise bad_value(
                "target_output_tokens_per_s", self.target_output_tokens_per_s,
                f"above the {offered:,.0f} output tokens/s that {self.request_rate_per_s:g} requests/s x {self.osl_mean_tokens:,.0f} "
                f"output tokens bring, which no deployment can exceed; raise request_rate_per_s (--rate) to "
                f">= {self.target_output_tokens_per_s / self.osl_mean_tokens:.4g} or lower the target (--target-throughput)",
                where=f"workload {self.name!r}",
            )

    def lengths(self) -> RequestLengths | None:
        """The per-request lengths of `lengths_file` (None without one)."""
        return read_lengths(self.lengths_file) if self.lengths_file else None

    @property
    def offered_output_tokens_per_s(self) -> float | None:
        """Mean output tokens/s the traffic asks for: Poisson arrivals' rate x mean output tokens, else
        the throughput target, else None (a burst or closed loop without a target asks for no rate)."""
        if self.arrival == Arrival.POISSON and math.isfinite(self.request_rate_per_s):
            return self.request_rate_per_s * self.osl_mean_tokens
        return self.target_output_tokens_per_s or None

    @property
    def has_slo(self) -> bool:
        return math.isfinite(self.ttft_slo_s) or math.isfinite(self.tpot_slo_s)

    def describe(self) -> str:
        arrival = {
            Arrival.POISSON: f"Poisson {self.request_rate_per_s:g} req/s",
            Arrival.BURST: f"burst of {self.num_requests}",
            Arrival.CLOSED: f"closed loop, {self.concurrency} in flight, {self.num_requests:,} requests (first wave {min(self.concurrency / self.num_requests, 1.0):.0%})",
        }[self.arrival]
        slo = []
        if math.isfinite(self.ttft_slo_s):
            slo.append(f"p{self.slo_percentile:g} TTFT <= {self.ttft_slo_s * 1e3:g} ms")
        if math.isfinite(self.tpot_slo_s):
            slo.append(f"p{self.slo_percentile:g} TPOT <= {self.tpot_slo_s * 1e3:g} ms")
        target = f", target {self.target_output_tokens_per_s:,.0f} output tok/s" if self.target_output_tokens_per_s else ""
        source = f" (lengths from {self.lengths_file})" if self.lengths_file else ""
        return (
            f"{self.name}: ISL ~{self.isl_mean_tokens:,.0f}, OSL ~{self.osl_mean_tokens:,.0f}{source}, {arrival}, "
            f"prefix hit {self.prefix_hit_rate:.0%}{', ' + ', '.join(slo) if slo else ''}{target}"
        )


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
