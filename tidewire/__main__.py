"""`python -m tidewire serve ...`: the `tidewire` command."""

from tidewire.gateway.cli import app

app()
