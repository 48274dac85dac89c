"""The OLMo oracle: OLMo-core's numpy datasets (ai2-olmo-core 3.0.0; tests/run_all.sh installs it without
its training stack: these modules need cached-path, google-cloud-storage, dataclass-extensions, bettermap
and dill beside torch and numpy)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

# Its import takes seconds (torch, its config stack) and its datasets keep state per process: it runs
# in its own interpreter, once for every read a test module needs.
_READ = """
import json, sys
import numpy as np
from olmo_core.data.numpy_dataset import NumpyFSLDataset, NumpyPaddedFSLDataset
out = []
for a in json.load(sys.stdin):
    common = dict(sequence_length=a["sequence_length"], pad_token_id=a["pad"], eos_token_id=a["eos"],
                  vocab_size=a["vocab"], dtype=getattr(np, a["dtype"]))
    fsl = NumpyFSLDataset(*a["paths"], generate_doc_lengths=True, **common)
    padded = NumpyPaddedFSLDataset(*a["paths"], **common)
    padded.work_dir = a["work_dir"]
    padded.prepare()
    out.append(dict(windows=[fsl[i]["input_ids"].tolist() for i in range(len(fsl))],
                    doc_lens=[fsl[i]["doc_lens"].tolist() for i in range(len(fsl))],
                    documents=[padded[i]["input_ids"][padded[i]["label_mask"]].tolist() for i in range(len(padded))]))
json.dump(out, sys.stdout)
"""


def read(jobs: list[dict]) -> list[dict]:
    """What OLMo-core serves from each job's token files ``paths`` (``dtype``, ``eos``, ``vocab``,
    ``pad``, ``sequence_length``; ``work_dir`` for its document indices): ``windows``, the
    ``sequence_length`` windows its NumpyFSLDataset serves, with the ``doc_lens`` it finds in each,
    and ``documents``, each document its NumpyPaddedFSLDataset serves (its tokens without padding)."""
    proc = subprocess.run([sys.executable, "-c", _READ], input=json.dumps(jobs), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [{k: [np.asarray(x) for x in v] for k, v in r.items()} for r in json.loads(proc.stdout)]
