/* Power of two choices on the queue model: a load-balancing plugin (switch.load_balancing: plugin,
 * docs/extending.md).
 *
 * The flow's key is hashed twice — the switch's ECMP hash (lb_hash) and a second, independent hash of the same
 * fields (lb_hash2) — to two different members of the group; the packet takes the one whose egress queue is
 * shorter: the virtual queue the packet would join, by the measure adaptive routing uses (lb/adaptive.h
 * ar_cost, switch.adaptive.metric: `queue` its drain time, `load` the port's busy time over the last
 * switch.adaptive.load_window, `queue+load` their sum); ties (both empty, say) at random. Comparing two random
 * candidates instead of all of them keeps the per-decision cost flat and still removes most of the hash's
 * collisions (the balls-in-bins maximum drops from log n / log log n to log log n).
 *
 * The choice is kept so that one flow is not reordered: per flow (default), or with per_flowlet = 1 per
 * flowlet — a new choice only after an idle gap longer than switch.flowlet_timeout (a gap longer than the
 * difference of the paths' queueing delays cannot reorder). A kept member whose link is lost is chosen again.
 *
 * Parameters (switch.plugin.params): per_flowlet (0 | 1, default 0), salt (the second hash's salt, default
 * 0x2c1b3c6d; any value ≠ 0).
 */

#ifdef PLUGIN_PARAM_PER_FLOWLET
#define TWO_CHOICES_PER_FLOWLET ftb_plugin_param(PLUGIN_PARAM_PER_FLOWLET)
#else
#define TWO_CHOICES_PER_FLOWLET 0
#endif
#ifdef PLUGIN_PARAM_SALT
#define TWO_CHOICES_SALT ((__u32)ftb_plugin_param(PLUGIN_PARAM_SALT))
#else
#define TWO_CHOICES_SALT 0x2c1b3c6du
#endif

/* The two candidates of the flow (different slots), and the one with the shorter queue. */
FTB_ALWAYS_INLINE __u64 two_choices_pick(struct lb_args *a)
{
	__u64 c1 = pick_slot(lb_hash(a), a->n), c2 = pick_slot(lb_hash2(a, TWO_CHOICES_SALT), a->n - 1), q1, q2;

	if (c2 >= c1)
		c2++;                         /* n − 1 others: never the same member twice */
	if (lb_port_down(a, c1))
		return c2;                    /* (both down: the failover stage finds a live one) */
	if (lb_port_down(a, c2))
		return c1;
	q1 = ar_cost(a->cfg, lb_port(a, c1), lb_prio(a), lb_now(a), 0, 0);
	q2 = ar_cost(a->cfg, lb_port(a, c2), lb_prio(a), lb_now(a), 0, 0);
	if (q1 == q2)
		return bpf_get_prandom_u32() & 1 ? c2 : c1;
	return q2 < q1 ? c2 : c1;
}

FTB_ALWAYS_INLINE __u64 ftb_plugin_choose(struct lb_args *a)
{
	struct flow_state *fs = a->fs;
	__u64 now, slot;

	if (!fs)
		return pick_slot(lb_hash(a), a->n);  /* no flow state (a full table): the hash keeps the flow on one path */
	now = lb_now(a);
	slot = fs->slot;
	if (fs->last_ns == 0 || slot >= a->n || lb_port_down(a, slot) ||
	    (TWO_CHOICES_PER_FLOWLET && now - fs->last_ns > a->cfg->flowlet_timeout_ns)) {
		slot = two_choices_pick(a);
		fs->slot = slot;
		fs->flowlets++;
	}
	fs->last_ns = now;
	return slot;
}
