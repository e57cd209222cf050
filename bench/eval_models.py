"""The model report: docs/models.md, from the simulator's 183 days with a fixed seed.

Run: ``.venv/bin/python bench/eval_models.py [--seed N] [--cache DIR] [--no-report]`` (``make eval``);
``--validation-only [--only TEXT]`` ranks (some of) the candidates and stops.

Simulates the handbook's run (5,000 cards, 10,000 terminals, 183 days from 2018-04-01), computes every
feature the feature job computes by the batch path, and measures, under the one test protocol of
`fraud train` and `fraud ab run` (``models.splits.EvalProtocol``, its default):

* the handbook's single-week split (training ending 2018-07-31, 7 days of delay, test 2018-08-08..14)
  and its 4-fold prequential test (test weeks from 2018-08-08, 08-15, 08-22, 08-29), for the handbook's
  baselines (logistic regression, a depth-2 tree, a random forest; its 15 features, no class weights)
  and the project's default model (``models.estimators.DEFAULT_SPEC``, every feature), with the published
  figures beside them;
* the choice of the default: candidate classifiers, depths, class weights and training lengths ranked on
  4 validation weeks (2018-07-04..31, the handbook's), all before the first test week, never on it; the
  default is the shallowest candidate within one standard error of the best (``choose``);
* what the single week allows: the default beside models perfect on its frauds, or on all but those no
  label can show yet (``ceilings``);
* the features' importances in the default model (permutation importance on the single test week: the
  drop in average precision when a feature's values are shuffled).

New features reach the report by themselves: the "all" feature set and the importances follow the
feature specs (``features.definitions``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import report

from contracts.events import TxColumns
from features.definitions import DAY_MS, DEFAULT_PARAMS, EVENT_TIME_MS, KNOWN_AT_MS, TX_TIME_MS
from ingest.simulator import SCENARIO2_DAYS, SimulatorConfig, simulate
from models.dataset import Dataset, file_dataset
from models.estimators import DEFAULT_SPEC, DEFAULT_TRAIN_DAYS, ModelSpec, feature_set
from models.metrics import average_precision, card_precision_at_k, card_precision_key
from models.splits import (
    DEFAULT_KNOWN_FRAUDS,
    DEFAULT_PROTOCOL,
    KNOWN_FRAUDS,
    TARGET,
    TEST_DAY,
    EvalProtocol,
    SplitPlan,
    fold_plans,
    split,
)
from models.training import FoldResult, TrainingResult, train_and_evaluate

DOC = report.ROOT / "docs" / "models.md"
#: The column of the cached fraud scenarios.
SCENARIO = "scenario"
#: How the report names the candidate validation chose (a test reads this line).
CHOSEN = "Chosen on validation: "
CP = card_precision_key(100)
METRICS = ("roc_auc", "average_precision", CP)
#: The handbook's split: first test day, delay, test days; 4 prequential folds counted forward from it.
TEST_START = dt.date(2018, 8, 8)
VALIDATION_START = dt.date(2018, 7, 4)
GAP_DAYS = 7
TEST_DAYS = 7
FOLDS = 4
LABEL_DELAY_MS = 7 * DAY_MS
MAX_EVENT_BYTES = 16_384

#: Published figures (Le Borgne et al., the handbook's notebooks on its own simulated data): the baseline
#: chapter's single week (Chapter_3_GettingStarted/BaselineModeling) and the model-selection chapter's
#: 4-fold prequential test means (Chapter_5_ModelValidationAndSelection/ModelSelection), AUC/AP/CP@100.
PUBLISHED_SINGLE = {
    "logistic regression": (0.871, 0.606, 0.291),
    "decision tree, depth 2": (0.763, 0.496, 0.241),
    "random forest": (0.867, 0.658, 0.287),
    "XGBoost (handbook default)": (0.862, 0.639, 0.273),
}
PUBLISHED_PREQUENTIAL = {
    "decision tree, depth 2": (0.792, 0.542, 0.265),
    "XGBoost, chosen on validation (100 trees, depth 5)": (0.872, 0.692, 0.304),
}


@dataclass(frozen=True)
class Candidate:
    """A model to measure: its name, spec, feature set and training days."""

    name: str
    spec: ModelSpec
    features: str = "all"
    train_days: int = 7


BASELINES = (
    Candidate("logistic regression", ModelSpec("logistic_regression", class_weight="none"), "handbook"),
    Candidate(
        "decision tree, depth 2", ModelSpec("decision_tree", max_depth=2, class_weight="none"), "handbook"
    ),
    Candidate("random forest", ModelSpec("random_forest", class_weight="none"), "handbook"),
)


def candidates() -> list[Candidate]:
    """The default's candidates: boosted trees, shallow (depth 3) or not (31 leaves a tree), with or without
    class weights, trained on 1 week; on 4 weeks with class weights; on 8 weeks at depths 3, 5, 8 and unlimited."""
    grid = [(7, depth, weight) for depth in (3, None) for weight in ("balanced", "none")]
    grid += [(28, None, "balanced"), (28, None, "none"), (28, 3, "balanced")]
    grid += [(56, depth, "balanced") for depth in (3, 5, 8, None)]
    found = []
    for days, depth, weight in grid:
        spec = ModelSpec("hist_gradient_boosting", max_depth=depth, class_weight=weight)  # type: ignore[arg-type]
        found.append(Candidate(spec.describe(days), spec, "all", days))
    # LightGBM with the same settings, where the boosted trees did best: its booster explains each score.
    for days in (28, 56):
        spec = ModelSpec("lightgbm", class_weight="balanced")
        found.append(Candidate(spec.describe(days), spec, "all", days))
    return found


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulation")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="keep the computed dataset and the validation figures here for later runs",
    )
    parser.add_argument(
        "--validation-only", action="store_true", help="rank the candidates on validation, then stop"
    )
    parser.add_argument(
        "--only",
        default="",
        help="with --validation-only: rank just the candidates whose name holds this text (e.g. '56 training')",
    )
    report.add_flag(parser)
    args = parser.parse_args()
    if args.only and not args.validation_only:
        parser.error("--only ranks a subset of the candidates: it goes with --validation-only")
    return args


def dataset_of(seed: int, cache: Path | None) -> tuple[Dataset, pd.Series]:
    """The simulation's dataset (features by the batch path) and each transaction's fraud scenario (by tx id:
    the simulator's, which the dataset does not keep), from the cache when it holds them."""
    files = {
        name: None if cache is None else cache / f"{name}-{seed}.parquet"
        for name in ("rows", "labels", "scenarios")
    }
    if all(path is not None and path.exists() for path in files.values()):
        rows, labels, scenarios = (pd.read_parquet(path) for path in files.values())
        if set(DEFAULT_PARAMS.feature_columns) <= set(rows.columns):
            print(f"dataset from {cache}")
            return Dataset(rows, labels, f"simulator seed {seed}"), scenarios[SCENARIO]
    started = time.monotonic()
    frame = simulate(SimulatorConfig(seed=seed))
    print(f"simulated {len(frame):,} transactions in {time.monotonic() - started:.0f} s")
    scenario = pd.Series(
        frame[TxColumns.FRAUD_SCENARIO].to_numpy(), index=frame[TxColumns.TX_ID].to_numpy(), name=SCENARIO
    )
    started = time.monotonic()
    dataset = file_dataset(frame, f"simulator seed {seed}", DEFAULT_PARAMS, MAX_EVENT_BYTES)
    print(f"features in {time.monotonic() - started:.0f} s")
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        dataset.rows.to_parquet(files["rows"])
        dataset.labels.to_parquet(files["labels"])
        scenario.to_frame().to_parquet(files["scenarios"])
    return dataset, scenario


def plans(first_test: dt.date, train_days: int, folds: int) -> list[SplitPlan]:
    """``folds`` plans whose test weeks start at ``first_test`` and follow each other."""
    first = SplitPlan(first_test - dt.timedelta(days=train_days + GAP_DAYS), train_days, GAP_DAYS, TEST_DAYS)
    return fold_plans(first.shifted((folds - 1) * TEST_DAYS), folds)


def measure(
    dataset: Dataset,
    candidate: Candidate,
    first_test: dt.date,
    folds: int,
    protocol: EvalProtocol = DEFAULT_PROTOCOL,
) -> TrainingResult:
    columns = feature_set(candidate.features, DEFAULT_PARAMS)  # type: ignore[arg-type]
    started = time.monotonic()
    result = train_and_evaluate(
        dataset, plans(first_test, candidate.train_days, folds), candidate.spec, columns, protocol=protocol
    )
    figures = " ".join(f"{result.metrics[m]:.3f}" for m in METRICS)
    print(f"  {candidate.name} from {first_test} x{folds}: {figures} ({time.monotonic() - started:.0f} s)")
    return result


def validation_metrics(
    dataset: Dataset, candidate: Candidate, seed: int, cache: Path | None
) -> dict[str, float]:
    """The candidate's mean metrics on the validation folds (from the cache when it holds them: they are
    deterministic for a seed and a set of features)."""
    features = hashlib.sha256(",".join(DEFAULT_PARAMS.feature_columns).encode()).hexdigest()[:8]
    path = None if cache is None else cache / f"validation-{seed}-{features}.json"
    known = json.loads(path.read_text()) if path is not None and path.exists() else {}
    if candidate.name not in known:
        known[candidate.name] = measure(dataset, candidate, VALIDATION_START, FOLDS).metrics
        if path is not None:
            path.write_text(json.dumps(known, indent=1))
    return dict(known[candidate.name])


def _cells(metrics: dict[str, float], folds: int) -> list[str]:
    if folds == 1:
        return [f"{metrics[m]:.3f}" for m in METRICS]
    return [f"{metrics[m]:.3f} ± {metrics[m + '_std']:.3f}" for m in METRICS]


def _published(figures: tuple[float, float, float] | None) -> str:
    return "" if figures is None else " / ".join(f"{v:.3f}" for v in figures)


def importances(dataset: Dataset, candidate: Candidate, repeats: int = 3) -> list[tuple[str, float, float]]:
    """Permutation importance of each input of ``candidate`` on the single test week: mean and std of the
    drop in average precision over ``repeats`` shuffles, largest first."""
    from sklearn.inspection import permutation_importance

    columns = list(feature_set(candidate.features, DEFAULT_PARAMS))  # type: ignore[arg-type]
    data = split(dataset, plans(TEST_START, candidate.train_days, 1)[0], DEFAULT_PROTOCOL)
    result = train_and_evaluate(
        dataset, [data.plan], candidate.spec, tuple(columns), protocol=DEFAULT_PROTOCOL
    )
    found = permutation_importance(
        result.pipeline,
        data.test[columns],
        data.test[TARGET].to_numpy(),
        scoring="average_precision",
        n_repeats=repeats,
        random_state=0,
    )
    ranked = sorted(
        zip(columns, found.importances_mean, found.importances_std, strict=True), key=lambda item: -item[1]
    )
    return [(name, float(mean), float(std)) for name, mean, std in ranked]


def ceilings(dataset: Dataset, scenario_of: pd.Series, week: FoldResult) -> report.Table:
    """What the single test week allows: the default's AP and CP@100 on it (``week``: its fold of the
    prequential test) beside those of a model perfect on every fraud, and of one perfect on every fraud but
    those no label can show yet: a compromised terminal's frauds (the simulator's scenario 2) before any
    fraud of that terminal in the compromise's days is known (labels come a week late), which keep the
    default's scores. ``scenario_of``: the simulator's scenario of each transaction, by tx id."""
    test = split(dataset, week.plan, DEFAULT_PROTOCOL).test  # the rows ``week.test_scores`` score
    scores = week.test_scores
    fraud = test[TARGET].to_numpy() == 1
    scenario = scenario_of.reindex(test[TxColumns.TX_ID].to_numpy()).to_numpy()
    unseen = fraud & (scenario == 2) & ~_terminal_fraud_known(test, dataset.labels)

    def cells(ranked: np.ndarray) -> list[str]:
        cards = card_precision_at_k(test[TxColumns.CARD_ID], test[TEST_DAY], fraud.astype(int), ranked, 100)
        return [f"{average_precision(fraud.astype(int), ranked):.3f}", f"{cards.mean:.3f}"]

    first = scores.max() + 1.0  # a perfect model's frauds above every other row, in the model's order
    shares = ", ".join(f"{n} of scenario {k}" for k, n in sorted(Counter(scenario[fraud].tolist()).items()))
    cards_a_day = test.loc[fraud].groupby(TEST_DAY)[TxColumns.CARD_ID].nunique()
    return report.Table(
        ["scores", "AP", "CP@100"],
        [
            ["the default's", *cells(scores)],
            ["perfect on every fraud", *cells(np.where(fraud, first + scores, scores))],
            [
                f"perfect on every fraud but the {int(unseen.sum())} not yet knowable (those keep the default's)",
                *cells(np.where(fraud & ~unseen, first + scores, scores)),
            ],
        ],
        caption="What the single test week allows: the default beside models perfect on (some of) its frauds",
        notes=[
            f"The week's {int(fraud.sum())} frauds (after the known-card rule): {shares} (the simulator's "
            "scenarios: 1, amounts over 220; 2, compromised terminals for 28 days; 3, compromised cards).",
            "Not yet knowable: a compromised terminal's frauds before any fraud label of that terminal's last "
            f"{SCENARIO2_DAYS} days is known; no feature can tell them from the terminal's other transactions "
            "(the same amounts and times), and they are at least the compromise's first week. A test day "
            f"has {cards_a_day.min()} to {cards_a_day.max()} cards with a fraud, fewer than 100: a perfect "
            "model's CP@100 stays under 1.",
        ],
    )


def _terminal_fraud_known(rows: pd.DataFrame, labels: pd.DataFrame) -> np.ndarray:
    """Per row, whether a fraud of its terminal in the :data:`SCENARIO2_DAYS` before it was known at its
    time (its label known by then)."""
    frauds = labels.loc[
        labels[TxColumns.IS_FRAUD].astype(bool), [TxColumns.TERMINAL_ID, TX_TIME_MS, KNOWN_AT_MS]
    ]
    frauds = frauds.assign(**{TxColumns.TERMINAL_ID: frauds[TxColumns.TERMINAL_ID].astype(str)})
    keyed = pd.DataFrame(
        {
            "row": np.arange(len(rows)),
            TxColumns.TERMINAL_ID: rows[TxColumns.TERMINAL_ID].astype(str).to_numpy(),
            "at": rows[EVENT_TIME_MS].to_numpy(),
        }
    )
    pairs = keyed.merge(frauds, on=TxColumns.TERMINAL_ID)
    known = (pairs[KNOWN_AT_MS] <= pairs["at"]) & (pairs[TX_TIME_MS] > pairs["at"] - SCENARIO2_DAYS * DAY_MS)
    seen = np.zeros(len(rows), dtype=bool)
    seen[pairs.loc[known, "row"].to_numpy()] = True
    return seen


def choose(validated: list[tuple[Candidate, dict[str, float]]]) -> Candidate:
    """The default among the validated candidates (best average precision first): the shallowest whose
    average precision is within one standard error of the best's, the best of those at that depth.

    Candidates that close cannot be told apart on the validation weeks (the one-standard-error rule), and
    the shallower a tree, the cheaper each alert's reasons (TreeSHAP's work grows with the depth squared).
    """
    best = validated[0][1]
    floor = best["average_precision"] - best.get("average_precision_std", 0.0) / FOLDS**0.5
    close = [candidate for candidate, metrics in validated if metrics["average_precision"] >= floor]
    return min(close, key=lambda c: c.spec.max_depth or float("inf"))  # min keeps the first of a tie


def main() -> None:
    args = _parse_args()
    started = time.monotonic()
    dataset, scenario_of = dataset_of(args.seed, args.cache)
    print(f"{len(dataset.rows):,} transactions, {len(dataset.labels):,} frauds")

    print("validation (test weeks from 2018-07-04, before any test week):")
    chosen_from = [c for c in candidates() if args.only in c.name]
    validated = [(c, validation_metrics(dataset, c, args.seed, args.cache)) for c in chosen_from]
    validated.sort(key=lambda pair: -pair[1]["average_precision"])
    chosen = choose(validated)
    print(
        f"chosen on validation: {chosen.name}" + (f" (of those holding {args.only!r})" if args.only else "")
    )
    if (chosen.spec, chosen.train_days) != (DEFAULT_SPEC, DEFAULT_TRAIN_DAYS):
        print(
            f"note: the code's default is {DEFAULT_SPEC.describe(DEFAULT_TRAIN_DAYS)}: set it to the chosen one"
        )
    if args.validation_only:
        return
    default = Candidate("the default", chosen.spec, "all", chosen.train_days)

    print("test:")
    rows_single, rows_prequential = [], []
    weeks: dict[str, FoldResult] = {}
    for candidate in (*BASELINES, default):
        prequential = measure(dataset, candidate, TEST_START, FOLDS)
        weeks[candidate.name] = prequential.folds[0]  # the first fold is the single week
        single = weeks[candidate.name].metrics
        rows_single.append(
            [candidate.name, *_cells(single, 1), _published(PUBLISHED_SINGLE.get(candidate.name))]
        )
        rows_prequential.append(
            [
                candidate.name,
                *_cells(prequential.metrics, FOLDS),
                _published(PUBLISHED_PREQUENTIAL.get(candidate.name)),
            ]
        )
    for name, figures in PUBLISHED_SINGLE.items():
        if name not in {c.name for c in BASELINES}:
            rows_single.append([f"{name} (published only)", "", "", "", _published(figures)])
    for name, figures in PUBLISHED_PREQUENTIAL.items():
        if name not in {c.name for c in BASELINES}:
            rows_prequential.append([f"{name} (published only)", "", "", "", _published(figures)])

    rules = []
    for rule in KNOWN_FRAUDS:
        protocol = EvalProtocol(rule)  # type: ignore[arg-type]
        data = split(dataset, plans(TEST_START, default.train_days, 1)[0], protocol)
        result = measure(dataset, default, TEST_START, 1, protocol)
        rules.append(
            [
                f"`{rule}`" + (" (default)" if rule == DEFAULT_KNOWN_FRAUDS else ""),
                f"{len(data.test):,}",
                f"{int(data.test[TARGET].sum()):,}",
                *_cells(result.metrics, 1),
            ]
        )
    ranked = importances(dataset, default)
    allowed = ceilings(dataset, scenario_of, weeks[default.name])
    headers = ["model", "AUC", "AP", "CP@100", "published AUC / AP / CP@100"]
    tables = [
        report.Table(
            headers,
            rows_single,
            caption=(
                "Single week: training ends 2018-07-31 (the handbook's 7 days for the baselines), delay 7 "
                "days, test 2018-08-08..14"
            ),
            notes=[f"The default: {chosen.name}, {len(feature_set('all', DEFAULT_PARAMS))} features."],
        ),
        allowed,
        report.Table(
            headers,
            rows_prequential,
            caption="4-fold prequential test: test weeks from 2018-08-08, 08-15, 08-22, 08-29 (mean ± std)",
        ),
        report.Table(
            ["candidate", "AUC", "AP", "CP@100"],
            [[c.name, *_cells(metrics, FOLDS)] for c, metrics in validated],
            caption="Choosing the default on 4 validation weeks from 2018-07-04 (mean ± std), best AP first",
            notes=[
                "The chosen one is the shallowest within one standard error of the best AP (std / √4).",
                f"{CHOSEN}{chosen.name}. `fraud train`'s default (models.estimators.DEFAULT_SPEC, "
                "DEFAULT_TRAIN_DAYS) is this one: a test checks that this line names it.",
            ],
        ),
        report.Table(
            ["known frauds", "test rows", "test frauds", "AUC", "AP", "CP@100"],
            rules,
            caption="The default on the single test week under each --known-frauds rule",
        ),
        report.Table(
            ["feature", "AP drop when shuffled", "std"],
            [[name, f"{mean:.4f}", f"{std:.4f}"] for name, mean, std in ranked],
            caption="Feature importances of the default on the single test week (permutation, 3 repeats)",
        ),
    ]
    settings = {
        "seed": args.seed,
        "days": SimulatorConfig().days,
        "known_frauds": DEFAULT_PROTOCOL.known_frauds,
    }
    print(f"make eval took {time.monotonic() - started:.0f} s")
    if args.no_report:
        for table in tables:
            print(report.markdown_table(table), end="\n\n")
        return
    report.write_section("models", script=__file__, tables=tables, settings=settings, title="Models", doc=DOC)


if __name__ == "__main__":
    main()
