"""`python -m gateway serve ...`"""

from gateway.cli import app

app()
