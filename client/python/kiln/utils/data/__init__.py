"""kiln.utils.data: datasets, samplers and the DataLoader (torch.utils.data)."""
from kiln.utils.data.dataloader import DataLoader, default_collate  # noqa: F401
from kiln.utils.data.dataset import (ConcatDataset, Dataset, IterableDataset, Subset,  # noqa: F401
                                     TensorDataset, random_split)
from kiln.utils.data.distributed import DistributedSampler  # noqa: F401
from kiln.utils.data.sampler import (BatchSampler, RandomSampler, Sampler,  # noqa: F401
                                     SequentialSampler, SubsetRandomSampler)
