"""``isrwatch doctor``: checks the whole path, a row a check (docs/doctor.md).

docs/architecture.md maps every module.
"""
