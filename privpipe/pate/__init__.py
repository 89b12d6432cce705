"""PATE: teachers on disjoint shards, noisy vote aggregation with its privacy analysis,
and a student trained by associative domain adaptation.

Papernot et al. 2017 ("Semi-supervised knowledge transfer for deep learning from private
training data"), 2018 ("Scalable private learning with PATE"); Haeusser et al. 2017
("Associative domain adaptation").
"""
