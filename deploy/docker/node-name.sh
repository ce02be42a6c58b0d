#!/bin/sh
# Entry point of the Crescent images: runs its arguments with CRESCENT_NODE made a valid Crescent
# node name. Kubernetes node names are DNS names (ip-10-0-1-2.ec2.internal) and a Crescent node
# name becomes a NATS subject token, which cannot hold a dot; '.' becomes '_', which no
# Kubernetes node name holds, so two nodes never end up with one name.
if [ -n "$CRESCENT_NODE" ]; then
    CRESCENT_NODE=$(printf '%s' "$CRESCENT_NODE" | tr . _)
    export CRESCENT_NODE
fi
exec "$@"
