"""The job's life: built from its settings (``assembly``), started, awaited and closed
(``job``), its one query (``query``) and what it does per micro-batch (``handler``), restarts,
stopping, what a killed job left behind (``leftovers``) and the checkpoint's origin.
docs/architecture.md maps every module."""
