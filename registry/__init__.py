"""The versioned model registry of normbridge: content-addressed blobs, SQL metadata, the service over both.

Layers, each importing only those below it: the store floor (`blobs/`, `db/`, `entities`,
`metadata`, `manifest_io`, `tensor_blobs`, `tar_reader`) on schemas alone; the service floor
(`service` and the modules it composes, `http/`, `web/`, `client`, `mlflow_bridge`, `artifact`),
which may also call converters' public API. Nothing here imports the CLI. See docs/layout.md.
"""
