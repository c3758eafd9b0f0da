"""Collections and their queries, judgements and documents: BEIR directories, the official
WikiQA files, ir_datasets ids and plain directories, each opened by one reader."""
