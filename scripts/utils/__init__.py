"""Repository tooling, as transformers keeps its own in `utils/` (`check_copies.py`, `check_repo.py`): the pages
rendered from their results and checked against them (`python -m scripts.utils.pages --check`, run by the tests)."""
