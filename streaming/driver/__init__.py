"""The driver's part of a micro-batch, after Spark's: the rows to statuses (``rows``), alerts,
the store and the lookahead between batches (``monitor``, ``lookahead``, ``brokerwatch``,
``identity``), where alerts go (``notify``) and the driver's checkpoint (``checkpoint``).
docs/architecture.md maps every module."""
