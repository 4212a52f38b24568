"""Sandbox images: OCI image layouts and docker-archive tarballs, imported with no daemon
and no registry into one content-addressed layer store per host.

- `formats.py`  reads an OCI layout (directory or tar) or a `docker save` tarball into
                one manifest: the config blob and the layer blobs, digests verified;
- `layers.py`   unpacks one layer tar into an overlayfs lower directory (whiteouts as
                overlayfs whiteouts, owners shifted into the sandboxes' uid range);
- `store.py`    the store: layers by diff_id (stored once, whatever image or packaging
                brought them), images by name;
- `config.py`   the parts of the image config a sandbox applies: Env, WorkingDir, User,
                Entrypoint/Cmd;
- `rootfs.py`   inside a sandbox: the overlay root (shared read-only layers + the
                sandbox's private upper directory) and the user namespace.
"""
