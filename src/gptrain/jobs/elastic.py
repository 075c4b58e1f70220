"""Elastic jobs (`--nodes MIN:MAX`): what a supervisor does when one of the job's nodes is lost.

The workers run under torchrun's elastic form (launch.torchrun_args: --nnodes=MIN:MAX, c10d
rendezvous hosted by node 0, one in-place restart per node that may go). When a node dies (its
host killed, its agent gone), the collectives of the workers left fail, their torchrun agents
restart them and meet again without it, and the trainer resumes from the latest checkpoint with
the smaller world (DCP reshards the weights and optimizer; the data position is global, so it
carries over; a fixed train.global_batch_size keeps the batch the same). The supervisor's part
is only not to treat that node's end as the job's failure, and to say it in the job's events.

Node 0 holds the rendezvous store: its loss ends the attempt as on a fixed-size job (restarts,
then `gptrain resume`). Neither is a node lost when fewer than MIN nodes would be left.
"""

from __future__ import annotations


from gptrain.jobs import found, store


def newly_lost(spec, codes: list[int | None], lost: set[int]) -> list[int]:
    """The nodes that ended in error since the last poll and are lost rather than failed: not
    node 0, and while at least MIN nodes are left. Adds them to `lost`."""
    if not spec.elastic:
        return []
    out = []
    for node, code in enumerate(codes):
        if node and code not in (None, 0) and node not in lost and spec.nodes - len(lost) - 1 >= spec.min_nodes:
            lost.add(node)
            out.append(node)
    return out


def record_loss(name: str, spec, jdir, node: int, why: str, lost: set[int], owner: str,
                slots: list[int] | None = None) -> None:
    """The job's event for a lost node: which, why, and what happens now. `slots`: the local
    slots the job claimed (node n's are the n-th `accels` of them): the lost nodes' are freed
    in the same write, for the next job in line."""
    left = spec.nodes - len(lost)
    latest = found.latest(jdir)
    source = f"its latest checkpoint ({latest.name})" if latest is not None else "the start (no checkpoint yet)"
    message = (f"node {node} lost ({why}); elastic {spec.min_nodes}:{spec.nodes}: the job goes on with "
               f"{left} node(s), its workers restarted by torchrun from {source}, resharded to the smaller world")
    kept = None
    if slots:
        kept = [s for n in range(spec.nodes) if n not in lost for s in slots[n * spec.accels:(n + 1) * spec.accels]]
        message += f"; its slots {sorted(set(slots) - set(kept))} are free for other jobs"
    store.free_lost_slots(name, owner, kept, "node lost", message)  # (a supervisor writes only its own job)


def finished_line(spec, lost: set[int]) -> str:
    """The success message of an attempt that lost nodes (empty when none was lost)."""
    if not lost:
        return ""
    return (f"finished on {spec.nodes - len(lost)} of {spec.nodes} nodes "
            f"(lost: {', '.join(f'node {n}' for n in sorted(lost))})")


def check_worlds(spec, cfg) -> None:
    """A trainer job's layout (parallel degrees against the processes) must fit its nodes x
    accels, and an elastic one's layout and train.global_batch_size each world from MIN to MAX
    nodes: else it would be accepted and fail in every worker (or at its first node loss)."""
    import copy

    from gptrain.distributed.mesh import ParallelDims, apply_global_batch
    from gptrain.errors import UserError

    for nodes in range(spec.min_nodes if spec.elastic else spec.nodes, spec.nodes + 1):
        try:
            dims = ParallelDims.from_config(cfg.parallel, nodes * spec.accels)
            if spec.elastic:  # (a fixed world's batch is the trainer's to check, with the data it reads)
                apply_global_batch(copy.deepcopy(cfg), dims.dp, dims.pp)
        except UserError as e:
            if spec.elastic:
                raise UserError(f"--nodes {spec.min_nodes}:{spec.nodes}: with {nodes} node(s) of "
                                f"{spec.accels} process(es), {e}") from None
            raise UserError(f"--nodes {spec.nodes} --accels {spec.accels} ({nodes * spec.accels} processes): {e}") from None
