"""Data pipeline (PySpark jobs): placeholder package for the pipeline issue."""
