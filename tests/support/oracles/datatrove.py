"""The datatrove oracle: its tokenizer step and its reader (datatrove 0.10.1; tests/run_all.sh installs
it without its dependencies, of which these modules need only loguru and humanize: the test extra)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

# Its pipeline steps log through loguru and keep state per process: it runs in its own interpreter,
# as a user runs it.
_TOKENIZE = """
import json, sys
from datatrove.data import Document
from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer
for a in json.load(sys.stdin):
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(a["texts"])]
    DocumentTokenizer(a["folder"], a["tokenizer"], eos_token=a["eos"], save_filename="corpus", batch_size=97,
                      shuffle_documents=False, save_loss_metadata=a["loss"]).run(iter(docs), rank=a["rank"],
                                                                                 world_size=a["rank"] + 1)
"""


def tokenize(jobs: list[dict]) -> list[str]:
    """What datatrove's DocumentTokenizer writes for each job's ``texts`` (in order, EOS ``eos`` after
    each document, with its loss mask if ``loss``) into its ``folder``, from the Hugging Face
    ``tokenizer`` file, as its task ``rank`` (default 0): the path of each ``.ds``."""
    jobs = [dict(job, rank=job.get("rank", 0)) for job in jobs]
    proc = subprocess.run([sys.executable, "-c", _TOKENIZE], input=json.dumps(jobs), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [f"{job['folder']}/corpus_{job['rank']:05d}_unshuffled.ds" for job in jobs]


def documents(folder: str, token_size: int) -> list[np.ndarray]:
    """Every document of the one ``.ds`` in ``folder`` as datatrove's DatatroveFolderDataset serves it:
    one window of all its tokens, cut where the positions it reads from the ``.ds.index`` restart."""
    import glob
    import os

    from datatrove.utils.dataset import DatatroveFolderDataset

    (path,) = glob.glob(f"{folder}/*.ds")
    tokens = os.path.getsize(path) // token_size
    ds = DatatroveFolderDataset(folder, seq_len=tokens - 1, token_size=token_size, return_positions=True)
    assert len(ds) == 1
    item = ds[0]
    ids, positions = item["input_ids"].numpy(), item["positions"].numpy()
    return np.split(ids, np.flatnonzero(positions == 0)[1:])
