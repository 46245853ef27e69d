"""The node's HTTP admin port, one job: operating a running node over HTTP (the admin REST API under
`/api/v1`, Prometheus `/metrics`, the dashboard at `/`, `/healthz` and `/readyz`), served by uvicorn inside the
node's own event loop (`admin.server.AdminServer`)."""
