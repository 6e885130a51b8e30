/* ECMP: the flow's hash picks the member (multiply-shift, pick_slot), so a flow keeps one path and flows spread
 * as balls in bins. Also every mode's fallback when it has nothing better (no flow state, no WCMP table). */
#ifndef FTB_LB_ECMP_H
#define FTB_LB_ECMP_H

#include "choose.h"

FTB_ALWAYS_INLINE __u64 lb_ecmp_choose(struct lb_args *a)
{
	return pick_slot(lb_hash(a), a->n);
}

#endif
