/* load_balancing: plugin — the loader puts the scenario's switch.plugin.source here (testbed/datapath/source.py
 * replaces this file's text with the plugin's, after a generated `#define PLUGIN_PARAM_<NAME> <index>` per
 * parameter and PLUGIN_NPARAMS, and compiles with -DFTB_PLUGIN=1). The plugin defines
 *
 *     FTB_ALWAYS_INLINE __u64 ftb_plugin_choose(struct lb_args *a);
 *
 * with the signature of lb/choose.h. Without a plugin this file is compiled as it is: empty. */
