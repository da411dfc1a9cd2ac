"""What the job writes to isrwatch's topics: the state records by the executors
(``statewriter``), tombstones and dead letters (``outputs``), through a producer that never
blocks a batch (``producer``). docs/architecture.md maps every module."""
