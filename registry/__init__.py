"""The versioned model registry of normbridge: content-addressed blobs, SQL metadata, the service over both.

Layers, each importing only those below it: the store floor (`blobs/`, `db/`, `entities`,
`metadata`, `audit_chain`, `blob_leases`, `tokens`, `manifest_io`, `tensor_blobs`, `tar_reader`)
on schemas alone; the service floor (`service/`, `artifact`, `bundle_stream`, `diff`, `lineage`,
`http/`, `web/`, `client`, `mlflow_bridge`), which may also call converters' public API, at module
top. Nothing here imports the CLI. See docs/layout.md.
"""
