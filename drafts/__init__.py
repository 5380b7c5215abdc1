"""What every trained draft shares, below the methods that use it: the serial draft network (`serial_draft`), draft
checkpoints read and written (`checkpoint`), the tree search and static trees (`tree`), the tree-draft method base
(`method`), the training data (`data`), held-out accuracy (`evaluate`), and the one trainer (`train`) with its
plug-in interface (`family`; the serial draft's recipe in `serial_train`). A family (gumiho, eagle, eagle3, medusa,
hydra) lives in its method package and is named by conf/family/<name>.yaml."""
