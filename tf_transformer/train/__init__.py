"""Training: the run (:mod:`.run`) of compiled steps (:mod:`.step`, :mod:`.precision`) in a loop
(:mod:`.loop`), with its checkpoints (:mod:`.checkpoints`), evaluations (:mod:`.evaluate`, scored by
:mod:`.scores`), learning-rate schedules (:mod:`.schedules`), checkpoint averaging (:mod:`.average`),
TensorBoard summaries (:mod:`.summaries`) and progress bar (:mod:`.progress`)."""
