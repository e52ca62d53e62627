"""OCI image archives for the e2e tests (the product's node_check.images)."""

from nri_cdi_testbed.node_check.images import (
    BUSYBOX_IMAGE,
    DEFAULT_PATH,
    PAUSE_IMAGE,
    ImageConfig,
    LayerWriter,
    busybox_image,
    image_from_tree,
    pause_image,
    write_archive,
)

__all__ = ["BUSYBOX_IMAGE", "DEFAULT_PATH", "PAUSE_IMAGE", "ImageConfig", "LayerWriter",
           "busybox_image", "image_from_tree", "pause_image", "write_archive"]
