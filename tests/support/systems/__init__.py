"""The systems and faults megacache runs under in the system and cluster tiers: an emulated cluster
(``cluster``), what a fault test looks at (``faults``), a megacache run with a wrong gigatoken
(``faulty_gigatoken``), an S3 API server (``s3server``), torchrun ranks that call megacache
(``torchrun_rank``) and the venvs of every other declared Python (``venvs``)."""

import os

#: one rank of a torchrun job that calls megacache: ``python -m torch.distributed.run ... TORCHRUN_RANK SPEC.json``
TORCHRUN_RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_rank.py")
