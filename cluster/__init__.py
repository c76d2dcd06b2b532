"""The top layer: every process and socket. Role servers (sequencer_server,
partition_server, traditional_server) run the I/O-free roles over ZeroMQ; launcher
starts and watches them; config is the cluster description; cli is ``ordo``; loadgen
drives load for the benchmarks and the TPC-C driver. Nothing below imports this.
"""
