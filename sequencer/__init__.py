"""Sequencer role (Calvin's preprocessor): intake, epochs, durable log, broadcast."""
