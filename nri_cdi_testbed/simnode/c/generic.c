/* Simulated NVIDIA driver library (nri-cdi's simulated node): every library of the node is
 * built from this file, so each one answers with its own file name and the driver version.
 * The builder (nri_cdi_testbed/simnode/csource.py) defines SIMNODE_EXPORT, SIMNODE_LIBRARY and
 * SIMNODE_DRIVER_VERSION before it; no header is included, because the 32-bit objects are
 * built without a libc. */
SIMNODE_EXPORT const char *fake_nvidia_library(void) { return SIMNODE_LIBRARY; }
SIMNODE_EXPORT const char *fake_nvidia_driver_version(void) { return SIMNODE_DRIVER_VERSION; }
