"""What a model directory holds: the names in it (:mod:`.layout`), the run files a training writes
(:mod:`.run_files`), the checks of a directory against the hyper-parameters (:mod:`.checks`), and its checkpoints
(:mod:`.checkpoint_files`)."""
