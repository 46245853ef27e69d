"""Load generators and benchmarks: `python -m loadtest.bench SCENARIO` and a locustfile."""
