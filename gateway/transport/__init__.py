"""What every connection arrives through: listeners and admission, the accept loop with the PROXY
protocol, WebSocket, and token buckets."""
