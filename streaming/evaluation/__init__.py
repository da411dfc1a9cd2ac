"""What Spark computes of one micro-batch (``batch``): the records parsed and checked
(``parse``), the rule at every observation against the state carried in (``replicas``,
``state``, the checkpoint's ``statetable``), statuses as expressions (``evaluate``).
docs/architecture.md maps every module."""
