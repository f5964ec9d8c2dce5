"""Channel options for every ``tritonclient.grpc`` client Tritonwatch creates.

tritonclient's own defaults (message size limits, keepalive) plus two that make "a new client
after an error" really mean a new connection attempt: grpc-python shares subchannels, and with
them the exponential reconnect back-off (up to 120 s), between channels to the same address.
After a Triton restart a probe or the load generator would otherwise sit out a back-off that
started while the server was down, and report it unreachable long after it came back.
"""

from __future__ import annotations

_MAX_MESSAGE = 2**31 - 1  # tritonclient's MAX_GRPC_MESSAGE_SIZE


def channel_args() -> list[tuple[str, int]]:
    # Imported here: tritonclient.grpc (and grpc) cost ~11 MB of RSS, which a collector
    # without gRPC targets or probes never needs.
    from tritonclient.grpc import KeepAliveOptions

    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keepalive.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
