"""The core of ``vitkit reproduce``: what runs (:mod:`.spec`), how runs are trained and scored
(:mod:`.scoring`, :mod:`.runner`, :mod:`.pool`, :mod:`.signals`), their results (:mod:`.results`),
the common part of every experiment (:mod:`.experiment`, :mod:`.registry`), the statistics
(:mod:`.stats`) and the report (:mod:`.report`). The core never imports an experiment: each
experiment registers itself (:func:`.registry.register`) when its module is imported.
"""
