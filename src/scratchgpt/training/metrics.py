"""``metrics.csv`` and ``loss.png``: what a run records as it goes, and its picture."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FIELDS = ["step", "tokens", "elapsed_s", "lr", "loss", "train_loss", "val_loss"]


def read_rows(path: Path, fields: Sequence[str] = tuple(FIELDS)) -> list[dict[str, str]]:
    """The well-formed rows of a metrics file; damaged ones (a crash mid-write, NUL bytes)
    are skipped rather than stopping anyone (a run's metrics are a record, not its state).
    ``fields``: the columns to keep (a task may add its own after :data:`FIELDS`)."""
    if not path.is_file():
        return []
    text = path.read_bytes().replace(b"\0", b"").decode("utf-8", errors="replace")
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        try:
            int(row["step"])
        except (KeyError, TypeError, ValueError):
            continue
        if all(_is_number(row.get(k) or "0") for k in fields[1:]):
            rows.append({k: row.get(k) or "" for k in fields})
    return rows


def _loss_unit(path: Path) -> str:
    """What a run's loss is averaged over: a classifier's (its metrics have ``val_acc``) over
    texts, one label each; every other run's over the tokens it predicts."""
    with path.open(encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), [])
    return "text" if "val_acc" in header else "token"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class MetricsLog:
    """Append-only ``metrics.csv`` (each row flushed at once, so a crash loses nothing).

    On resume the rows after the resumed step are dropped, so a resumed run's file matches
    an uninterrupted one. The kept rows are rewritten atomically (a full disk or a kill at
    that moment leaves the old file), then new rows are appended. ``extra_fields``: a task's
    own columns (e.g. ``val_acc``)."""

    def __init__(self, path: Path, resume_step: int | None, extra_fields: Sequence[str] = ()):
        from scratchgpt.checkpoints.io import atomic_write_text

        self.fields = [*FIELDS, *extra_fields]
        rows = [r for r in read_rows(path, self.fields) if int(r["step"]) <= resume_step] \
            if resume_step is not None else []
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.fields)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(path, text.getvalue())
        self.f = path.open("a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=self.fields)

    def row(self, **values: Any) -> None:
        self.w.writerow({k: ("" if values.get(k) is None else values[k]) for k in self.fields})
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def plot_losses(metrics_csv: Path, out_png: Path, title: str = "") -> None:
    """loss.png: training loss per logged step, and periodic train/val estimates."""
    from scratchgpt.viz import literal_text, pyplot

    plt = pyplot()
    with literal_text():  # (the title names the run's folder, which may hold a "$")
        _plot_losses(plt, metrics_csv, out_png, title)


def _plot_losses(plt: Any, metrics_csv: Path, out_png: Path, title: str) -> None:
    from scratchgpt.viz import note_missing_glyphs

    rows = read_rows(metrics_csv)
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    pts = [(int(r["step"]), float(r["loss"])) for r in rows if r["loss"]]
    if pts:
        ax.plot(*zip(*pts, strict=True), lw=0.8, alpha=0.6, label="train (batch)")
    for key, style in (("train_loss", "o-"), ("val_loss", "s-")):
        pts = [(int(r["step"]), float(r[key])) for r in rows if r[key]]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, ms=3.5, label=key.replace("_", " "))
    ax.set_xlabel("step")
    ax.set_ylabel(f"cross-entropy (nats/{_loss_unit(metrics_csv)})")
    ax.set_title(title or metrics_csv.parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = out_png.with_name(f".{out_png.name}.plot.tmp")
    try:
        # (the title names the run's folder, which may be in any script)
        note_missing_glyphs(fig, out_png)
        fig.savefig(tmp, format="png")
    finally:  # (a failed write leaves no figure open in a process that goes on)
        plt.close(fig)
    tmp.replace(out_png)
