/* Which simulated node this library belongs to (libcuda and libnvidia-ml): tests read it to
 * tell that a container was given this node's driver. SIMNODE_NODE_ID is defined by the
 * builder (nri_cdi_testbed/simnode/csource.py). */
SIMNODE_EXPORT const char *fake_gpu_node_id(void) { return SIMNODE_NODE_ID; }
