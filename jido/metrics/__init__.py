"""Metric records: plain dataclasses the core emits each step, read by servers, benches and the doctor."""
