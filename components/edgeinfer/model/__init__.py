"""com.edgeinfer.ModelStore: the model build pipeline (export, in-graph preprocessing, INT8, gate)."""
