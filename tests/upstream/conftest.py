# tests/upstream holds the runner for torch's own tests (run_suites.py, run on
# a GPU machine by hand), not tests of this project: `pytest tests` collects
# nothing here.
collect_ignore_glob = ["*"]
