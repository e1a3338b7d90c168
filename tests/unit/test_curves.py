"""The jobs' loss and metric curves the engine keeps in memory: points at their epoch position,
epoch ends (with the val_ metrics) apart, bounded per job, per metric name and in jobs, a long
run thinned over its whole span rather than cut."""

from __future__ import annotations

from trayapp.jobs import curves
from trayapp.jobs.curves import CurvePoint, Curves, FitStart, JobCurves, position


def test_a_position_is_the_epochs_done() -> None:
    assert position(3, 50, 100) == 2.5
    assert position(3, 100, 100) == 3.0
    assert position(1, None, None) == 1.0
    assert position(None, 5, 10) is None
    assert position(0, 5, 10) is None


def test_batch_points_and_epoch_ends_are_kept_apart() -> None:
    c = Curves()
    c.add("a", 1.0, epoch=1, step=5, steps=10, metrics={"loss": 0.9})
    c.add("a", 2.0, epoch=1, step=10, steps=10, metrics={"loss": 0.8})
    c.add("a", 2.5, epoch=1, step=10, steps=10, metrics={"loss": 0.7, "val_loss": 0.75})
    c.add("a", 3.0, epoch=2, step=None, steps=None, metrics={})  # no metrics: not kept
    c.add("a", 3.5, epoch=2, step=3, steps=10, metrics={"loss": float("nan")})  # not a value
    got = c.get("a")
    assert got.names == ("loss", "val_loss")
    assert got.batches == (CurvePoint(0.5, 1.0, {"loss": 0.9}),)
    assert got.epochs == (CurvePoint(1.0, 2.5, {"loss": 0.7, "val_loss": 0.75}),)
    assert c.get("nobody") == JobCurves()
    # On the wire and back, the same curves.
    assert got.to_json()["batches"] == [{"x": 0.5, "t": 1.0, "m": {"loss": 0.9}}]
    assert JobCurves.from_json(got.to_json()) == got


def test_a_later_fit_goes_on_from_where_the_one_before_ended() -> None:
    c = Curves()
    for epoch in (1, 2, 3):
        c.add("a", 1.0, epoch=epoch, step=4, steps=4, metrics={"loss": 1.0}, fit=1)
    c.add("a", 2.0, epoch=1, step=2, steps=4, metrics={"loss": 0.5}, fit=2)
    c.add("a", 3.0, epoch=1, step=4, steps=4, metrics={"loss": 0.4}, fit=2)
    got = c.get("a")
    assert [p.x for p in got.epochs] == [1.0, 2.0, 3.0, 4.0]
    assert got.batches == (CurvePoint(3.5, 2.0, {"loss": 0.5}),)
    assert got.fits == (FitStart(1, 0.0), FitStart(2, 3.0))


def test_a_long_run_is_thinned_over_its_whole_span() -> None:
    c = Curves()
    steps = 100
    n = 3 * curves.MAX_POINTS
    for i in range(n):
        epoch, step = divmod(i, steps)
        c.add("a", float(i), epoch=epoch + 1, step=step + 1 if step + 1 < steps else 1,
              steps=steps, metrics={"loss": 1.0 / (i + 1)})
    batches = c.get("a").batches
    assert len(batches) <= curves.MAX_POINTS
    assert batches[0].x < 1.0 and batches[-1].x > (n / steps) - 1.0  # start and end kept


def test_metric_names_and_jobs_are_bounded() -> None:
    c = Curves()
    c.add("a", 1.0, epoch=1, step=1, steps=10,
          metrics={f"m{i}": float(i) for i in range(curves.MAX_METRICS + 5)})
    assert len(c.get("a").names) == curves.MAX_METRICS
    for i in range(curves.MAX_JOBS + 3):
        c.add(f"job{i}", 1.0, epoch=1, step=1, steps=10, metrics={"loss": 1.0})
    assert c.get("a").batches == ()  # the oldest job's curves went first
    assert c.get(f"job{curves.MAX_JOBS + 2}").batches


def test_garbled_curves_read_as_what_can_be_read() -> None:
    """What the tray reads back from an answer: a part that is not curves is left out, never
    raised on; a point without a position, or a metric that is not a number, is dropped."""
    assert JobCurves.from_json(None) == JobCurves()
    assert JobCurves.from_json([1, 2]) == JobCurves()
    got = JobCurves.from_json({
        "names": ["loss", 3],
        "batches": [{"x": 0.5, "t": 1.0, "m": {"loss": 0.9, "acc": "high", "nan": float("nan")}},
                    {"x": "half", "m": {"loss": 1.0}}, {"x": True, "m": {}}, "point", None],
        "epochs": {"x": 1.0},
        "fits": [{"fit": 2, "x": 3.0}, {"fit": "2", "x": 3.0}, {"fit": True, "x": 1.0}],
    })
    assert got.names == ("loss", "3")
    assert got.batches == (CurvePoint(0.5, 1.0, {"loss": 0.9}),)
    assert got.epochs == () and got.fits == (FitStart(2, 3.0),)
