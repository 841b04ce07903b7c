"""ZeroMQ wire protocol and transports."""
