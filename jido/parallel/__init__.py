"""Process groups and collectives for tensor, pipeline and expert parallelism: the only users of torch.distributed."""
