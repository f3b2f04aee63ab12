"""PredictionWriter: streams `project.predict`'s rows to disk as they come, one part per rank, resumable
after a kill, merged into one JSONL or Parquet file at the end.

Each rank appends its batches' rows to `<out>.parts/rank-R.jsonl` and, after every batch, records in
`rank-R.json` how many batches and bytes are complete (written atomically). A run started again with the
same plan (checkpoint, shards, ranks, workers, batch size, output options) cuts each part back to its
last complete batch and starts its loader there, so a killed run finishes without predicting a sample
twice. When every rank is done, rank 0 merges the parts in rank order into `out` (a temporary file, then a
rename) and removes the parts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import lightning as L

from project.data import paths
from project.data.atomic import replace_atomically, write_atomically, write_json_atomically
from project.errors import UserError
from project.shown import shown

FORMATS = (".jsonl", ".parquet")
PARQUET_ROWS = 10_000  # rows per Parquet row group while merging


def check_output(out: Path) -> None:
    """Refuse an output path this writer cannot write, before any work."""
    if out.suffix not in FORMATS:
        raise UserError(f"--out {out}: the file name must end in {' or '.join(FORMATS)}")
    if out.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UserError('--out *.parquet needs pyarrow: pip install -e ".[parquet]" (or write .jsonl)') from None
    if out.is_dir():
        raise UserError(f"--out {out} is a folder: name a file")


class PredictionWriter(L.Callback):
    """Writes `Prediction`s as rows: key, pred (class name), pred_index, prob, top_classes, top_probs, label
    (when the sample has one), embedding (with `embeddings`) and log_probs (with `log_probs`).

    Args:
        out: the merged output file (.jsonl or .parquet).
        class_names: the model's classes, to name predictions.
        top_k: classes listed per row, most probable first.
        embeddings: add each sample's embedding (the features before the head).
        log_probs: add every class's calibrated log-probability, {class name: value}, for
            `python -m project.ensemble`.
        key_name: turns a sample key into what the row shows (a packed folder's file path).
        identity: what else the plan depends on (the checkpoint), for resuming.
    """

    def __init__(
        self,
        out: Path,
        class_names: list[str],
        *,
        top_k: int = 5,
        embeddings: bool = False,
        key_name: Callable[[str], str] = str,
        identity: str = "",
        log_probs: bool = False,
    ) -> None:
        self.out, self.class_names = Path(out), list(class_names)
        self.top_k, self.embeddings, self.log_probs = min(top_k, len(class_names)), embeddings, log_probs
        self.key_name, self.identity = key_name, identity
        self.parts = self.out.with_name(self.out.name + ".parts")
        self.file = None
        self.batches = self.bytes = self.rows = 0
        self.merged_rows: int | None = None  # on global rank zero, once the parts are merged

    def plan(self, trainer: L.Trainer) -> dict[str, Any]:
        """What decides which rows each batch holds: a run with another plan starts its part over."""
        data = trainer.datamodule
        shards = hashlib.sha256(json.dumps([(s.url, s.nsamples) for s in data.shards("predict")]).encode())
        return {
            "world_size": trainer.world_size,
            "num_workers": max(1, data.num_workers),
            "batch_size": data.batch_size,
            "shards": shards.hexdigest(),
            "top_k": self.top_k,
            "embeddings": self.embeddings,
            "log_probs": self.log_probs,
            "identity": self.identity,
        }

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "predict":
            return
        rank = trainer.global_rank
        part, progress_path = self.parts / f"rank-{rank}.jsonl", self.parts / f"rank-{rank}.json"
        for path in (part, progress_path):  # `<out>.parts` or a part planted as a link out of --out's folder
            paths.check_output(path, self.out.parent)
        paths.make_folder(self.parts)
        plan = self.plan(trainer)
        progress = json.loads(progress_path.read_text()) if progress_path.exists() else {}
        resumable = progress.get("plan") == plan and part.exists() and part.stat().st_size >= progress["bytes"]
        self.batches, self.bytes = (progress["batches"], progress["bytes"]) if resumable else (0, 0)
        self.rows = progress.get("rows", 0) if resumable else 0
        self.file = open(part, "r+b" if resumable else "wb")  # noqa: SIM115 - closed in on_predict_end
        self.file.truncate(self.bytes)  # a batch the kill cut short is written again
        self.file.seek(self.bytes)
        self.progress_path, self.plan_now = progress_path, plan
        if self.batches:
            trainer.datamodule.position.start_split_at("predict", self.batches)
            print(f"rank {rank}: resuming after {self.batches} batches ({self.rows} rows) in {shown(part)}", flush=True)

    def on_predict_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *batch_and_indexes: Any
    ) -> None:
        # Lightning passes the batch, its index and (with several loaders) the loader's index positionally
        lines = "".join(json.dumps(row) + "\n" for row in self.rows_of(outputs)).encode()
        self.file.write(lines)
        self.file.flush()
        os.fsync(self.file.fileno())  # on disk before the progress says so: neither a kill nor a crash loses rows
        self.batches, self.bytes, self.rows = self.batches + 1, self.bytes + len(lines), self.rows + len(outputs.keys)
        self.save_progress(done=False)

    def rows_of(self, prediction: Any) -> Iterator[dict[str, Any]]:
        probs = prediction.probs.detach().cpu()
        top = probs.topk(self.top_k, dim=1)
        labels = prediction.labels.tolist() if prediction.labels is not None else [-1] * len(prediction.keys)
        embeddings = prediction.embeddings.detach().cpu().tolist() if self.embeddings else None
        log_probs = None
        if self.log_probs:  # a model whose predict_step gives probabilities only: their log, floored
            given = getattr(prediction, "log_probs", None)
            log_probs = (given if given is not None else probs.clamp_min(1e-38).log()).detach().cpu().tolist()
        names = self.class_names
        for row, key in enumerate(prediction.keys):
            indexes, values = top.indices[row].tolist(), top.values[row].tolist()
            record = {
                "key": self.key_name(key),
                "pred": names[indexes[0]],
                "pred_index": indexes[0],
                "prob": round(values[0], 6),
                "top_classes": [names[i] for i in indexes],
                "top_probs": [round(v, 6) for v in values],
            }
            if labels[row] >= 0:
                record["label"] = names[labels[row]] if labels[row] < len(names) else str(labels[row])
            if embeddings is not None:
                record["embedding"] = [round(v, 6) for v in embeddings[row]]
            if log_probs is not None:
                record["log_probs"] = {name: round(v, 5) for name, v in zip(names, log_probs[row], strict=True)}
            yield record

    def save_progress(self, done: bool) -> None:
        state = {"plan": self.plan_now, "batches": self.batches, "bytes": self.bytes, "rows": self.rows, "done": done}
        write_json_atomically(self.progress_path, state)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.file.close()
        self.save_progress(done=True)
        trainer.strategy.barrier("predictions-written")
        if trainer.is_global_zero:
            lines = part_lines(self.parts, trainer.world_size)
            self.merged_rows = write_rows(self.out, lines, self.embeddings, self.log_probs)
            shutil.rmtree(self.parts, ignore_errors=True)
        trainer.strategy.barrier("predictions-merged")


def part_lines(parts: Path, world_size: int) -> Iterator[bytes]:
    """Every rank's rows, in rank order."""
    for rank in range(world_size):
        progress = json.loads((parts / f"rank-{rank}.json").read_text())
        if not progress.get("done"):
            raise RuntimeError(f"rank {rank} did not finish its predictions")
        with open(parts / f"rank-{rank}.jsonl", "rb") as part:
            yield from part


def write_rows(out: Path, lines: Iterable[bytes], embeddings: bool = False, log_probs: bool = False) -> int:
    """JSON lines (rows) as one file at `out`, whole or absent: JSONL as they are, or Parquet in row groups
    (with the embedding and log_probs columns when asked for); returns the row count."""
    rows = 0
    if out.suffix == ".jsonl":

        def write(merged: IO[bytes]) -> None:
            nonlocal rows
            for line in lines:
                merged.write(line)
                rows += 1

        write_atomically(out, write)
        return rows

    def write_parquet(temporary: Path) -> None:
        nonlocal rows
        import pyarrow as pa
        import pyarrow.parquet as pq

        fields = [
            ("key", pa.string()),
            ("pred", pa.string()),
            ("pred_index", pa.int64()),
            ("prob", pa.float64()),
            ("top_classes", pa.list_(pa.string())),
            ("top_probs", pa.list_(pa.float64())),
            ("label", pa.string()),
        ]
        fields += [("embedding", pa.list_(pa.float32()))] if embeddings else []
        fields += [("log_probs", pa.map_(pa.string(), pa.float32()))] if log_probs else []
        schema, chunk = pa.schema(fields), []
        with pq.ParquetWriter(str(temporary), schema) as writer:
            for line in lines:
                chunk.append(json.loads(line))
                if len(chunk) == PARQUET_ROWS:
                    writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                    rows, chunk = rows + len(chunk), []
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
            rows += len(chunk)

    replace_atomically(out, write_parquet)
    return rows
